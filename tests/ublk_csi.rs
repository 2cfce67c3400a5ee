//! Kernel test of the CSI driver on both transports, driven over its unix sockets the way the
//! kubelet and the attacher drive it: one S3 server (in-process), a controller (its own
//! daemon without devices, `glidefs csi --mode controller`) and two nodes, each a daemon
//! with its own data directory and a node plugin (`glidefs csi --mode node`), all processes.
//!
//! 1. Three volumes: `blk` (raw block, durability `store`), `fs` (ext4, `store`) and `loc`
//!    (ext4, `local`), published to node A, staged and published there (the block volume a
//!    bind of its device file, the others made and mounted). A ledger on each: 4 KiB records,
//!    each acknowledged by fsync (fdatasync on the device file); a snapshot of `fs` half way.
//! 2. Node A fails: `kill -9` of its daemon and its plugin; its mounts and devices go with
//!    the node, and its disk is discarded (data directory deleted). The volumes are
//!    force-detached and published, staged and published on node B with the takeover the
//!    publish grants.
//! 3. On B: every acknowledged record of `blk` and `fs` is there. `loc` comes up at a
//!    consistent point in time: its ledger is a prefix of what was acknowledged (the test
//!    prints how much was lost: what A acknowledged after its last flush to the store,
//!    `flush_interval_secs = 1`), and `e2fsck -fn` finds it clean.
//! 4. B's plugin is killed and restarted with `fs` staged and published: the calls repeated
//!    succeed and its stats answer. `fs` is expanded through CSI while in use (B's daemon
//!    grows it, `resize2fs` through NodeExpand); the snapshot is cloned through CSI and the
//!    clone holds the ledger of the snapshot's moment. Then everything is torn down and
//!    deleted.
//!
//! Prints the kernel and the transport. Needs /dev/ublk-control, mkfs.ext4, blkid, e2fsck,
//! resize2fs: `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glidefs_csi::pb;
use glidefs_csi::pb::controller_client::ControllerClient;
use glidefs_csi::pb::node_client::NodeClient;
use glidefs_testkit::pattern::pattern;
use tonic::transport::Channel;
use ublk_core::Transport;

use support::daemon::{glidefs, output_within, run, Daemon, Store};

const MIB: i64 = 1 << 20;
const RECORD: usize = 4096;
/// Records of each ledger, and how many come before the snapshot.
const RECORDS: u64 = 24;
const BEFORE_SNAPSHOT: u64 = 12;

/// A `glidefs csi` process; SIGKILL on drop.
struct Plugin {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl Plugin {
    fn start(work: &Path, store: &Store, args: &[&str]) -> Plugin {
        let socket = work.join("csi.sock");
        let log = work.join("csi.log");
        let _ = std::fs::remove_file(&socket);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("plugin log");
        let mut cmd = Command::new(glidefs());
        cmd.arg("csi")
            .args(args)
            .arg("--config")
            .arg(work.join("glidefs.toml"))
            .arg("--endpoint")
            .arg(&socket)
            .stdout(Stdio::from(out.try_clone().expect("log fd")))
            .stderr(Stdio::from(out));
        for (k, v) in store.env() {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn glidefs csi");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "glidefs csi {args:?} did not listen:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Plugin {
            child: Some(child),
            socket,
            log,
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("SIGKILL the plugin");
            c.wait().expect("reap the plugin");
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            println!(
                "plugin log {}:\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// The test's gRPC side (the kubelet and the sidecars).
struct Kube {
    rt: tokio::runtime::Runtime,
    work: PathBuf,
}

impl Kube {
    fn controller(&self, p: &Plugin) -> ControllerClient<Channel> {
        ControllerClient::new(
            self.rt
                .block_on(glidefs_csi::connect(&p.socket))
                .expect("connect"),
        )
    }

    fn node(&self, p: &Plugin) -> NodeClient<Channel> {
        NodeClient::new(
            self.rt
                .block_on(glidefs_csi::connect(&p.socket))
                .expect("connect"),
        )
    }

    fn staging(&self, node: &str, vol: &str) -> String {
        self.work
            .join(format!("kubelet-{node}/staging/{vol}"))
            .display()
            .to_string()
    }

    fn target(&self, node: &str, vol: &str) -> String {
        self.work
            .join(format!("kubelet-{node}/pods/p1/{vol}"))
            .display()
            .to_string()
    }
}

fn capability(fs: Option<&str>) -> pb::VolumeCapability {
    use pb::volume_capability::{
        access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
    };
    pb::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(match fs {
            None => AccessType::Block(BlockVolume {}),
            Some(f) => AccessType::Mount(MountVolume {
                fs_type: f.into(),
                ..Default::default()
            }),
        }),
    }
}

/// The volumes of the test: name, filesystem (`None`: raw block), durability.
const VOLUMES: [(&str, Option<&str>, &str); 3] = [
    ("blk", None, "store"),
    ("fs", Some("ext4"), "store"),
    ("loc", Some("ext4"), "local"),
];

fn create(
    k: &Kube,
    ctl: &Plugin,
    name: &str,
    fs: Option<&str>,
    durability: &str,
    source: Option<pb::VolumeContentSource>,
) {
    let req = pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 64 * MIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(fs)],
        parameters: HashMap::from([
            ("blockSize".to_string(), "64K".to_string()),
            ("durability".to_string(), durability.to_string()),
        ]),
        volume_content_source: source,
        ..Default::default()
    };
    let v =
        k.rt.block_on(k.controller(ctl).create_volume(req))
            .expect("CreateVolume")
            .into_inner();
    println!("created {name}: {:?}", v.volume.map(|v| v.capacity_bytes));
}

/// ControllerPublish to `node`, NodeStage, NodePublish: the volume's target path.
fn attach(
    k: &Kube,
    ctl: &Plugin,
    node: &Plugin,
    node_name: &str,
    vol: &str,
    fs: Option<&str>,
) -> String {
    let ctx =
        k.rt.block_on(k.controller(ctl).controller_publish_volume(
            pb::ControllerPublishVolumeRequest {
                volume_id: vol.into(),
                node_id: node_name.into(),
                volume_capability: Some(capability(fs)),
                ..Default::default()
            },
        ))
        .expect("ControllerPublish")
        .into_inner()
        .publish_context;
    let mut n = k.node(node);
    let context = HashMap::from([("durability".to_string(), durability_of(vol).to_string())]);
    k.rt.block_on(n.node_stage_volume(pb::NodeStageVolumeRequest {
        volume_id: vol.into(),
        publish_context: ctx,
        staging_target_path: k.staging(node_name, vol),
        volume_capability: Some(capability(fs)),
        volume_context: context,
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("NodeStage {vol} on {node_name}: {e}"));
    k.rt.block_on(n.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: k.staging(node_name, vol),
        target_path: k.target(node_name, vol),
        volume_capability: Some(capability(fs)),
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("NodePublish {vol} on {node_name}: {e}"));
    k.target(node_name, vol)
}

/// NodeUnpublish, NodeUnstage, ControllerUnpublish.
fn detach(k: &Kube, ctl: &Plugin, node: &Plugin, node_name: &str, vol: &str) {
    let mut n = k.node(node);
    k.rt.block_on(n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: vol.into(),
        target_path: k.target(node_name, vol),
    }))
    .expect("NodeUnpublish");
    k.rt.block_on(n.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: k.staging(node_name, vol),
    }))
    .expect("NodeUnstage");
    unpublish(k, ctl, node_name, vol);
}

fn unpublish(k: &Kube, ctl: &Plugin, node_name: &str, vol: &str) {
    k.rt.block_on(k.controller(ctl).controller_unpublish_volume(
        pb::ControllerUnpublishVolumeRequest {
            volume_id: vol.into(),
            node_id: node_name.into(),
            ..Default::default()
        },
    ))
    .expect("ControllerUnpublish");
}

fn durability_of(vol: &str) -> &'static str {
    VOLUMES.iter().find(|v| v.0 == vol).map_or("store", |v| v.2)
}

fn record(i: u64) -> Vec<u8> {
    pattern(i * RECORD as u64, 7, RECORD)
}

/// Appends records `from..to` to the ledger at `target` (a file in the mount, or the block
/// device file itself), each acknowledged by fsync before the next.
fn ledger_write(target: &str, block: bool, from: u64, to: u64) {
    let path = if block {
        PathBuf::from(target)
    } else {
        Path::new(target).join("ledger")
    };
    let mut f = std::fs::OpenOptions::new()
        .create(!block)
        .write(true)
        .custom_flags(if block { libc::O_DIRECT } else { 0 })
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // O_DIRECT wants a page-aligned buffer: a window of a larger one.
    let mut backing = vec![0u8; 2 * RECORD];
    let at = backing.as_ptr().align_offset(4096);
    for i in from..to {
        f.seek(SeekFrom::Start(i * RECORD as u64)).expect("seek");
        let buf = &mut backing[at..at + RECORD];
        buf.copy_from_slice(&record(i));
        f.write_all(buf).expect("write a record");
        f.sync_data().expect("fsync a record");
    }
}

/// How many records the ledger at `target` holds, checking each byte for byte; with
/// `exact`, all `RECORDS` must be there; else the ledger must be a prefix (consistent).
fn ledger_read(target: &str, block: bool, expect: u64) -> u64 {
    run("sync", &[]);
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
    let path = if block {
        PathBuf::from(target)
    } else {
        Path::new(target).join("ledger")
    };
    let mut bytes = Vec::new();
    match std::fs::File::open(&path) {
        Ok(mut f) => {
            let len = if block {
                expect as usize * RECORD
            } else {
                usize::MAX
            };
            Read::by_ref(&mut f)
                .take(len as u64)
                .read_to_end(&mut bytes)
                .expect("read the ledger");
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !block => {}
        Err(e) => panic!("open {}: {e}", path.display()),
    }
    assert_eq!(
        bytes.len() % RECORD,
        0,
        "{target}: a torn record ({} bytes)",
        bytes.len()
    );
    let n = (bytes.len() / RECORD) as u64;
    for i in 0..n {
        let got = &bytes[i as usize * RECORD..(i as usize + 1) * RECORD];
        assert!(
            got == record(i).as_slice(),
            "{target}: record {i} of {n} differs"
        );
    }
    n
}

/// The device id (`N` of `/dev/ublkbN`) of a volume on a daemon.
fn device_id(d: &Daemon, vol: &str) -> u32 {
    let path = support::daemon::str_of(&d.show(vol), "/device/path").to_string();
    path.trim_start_matches("/dev/ublkb")
        .parse()
        .expect("device id")
}

fn csi_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let w = work.path();
    let store = Store::s3();
    let ctl_daemon = Daemon::start_no_devices(&w.join("ctl"), &store);
    let a_daemon = Daemon::start(&w.join("a"), &store, t);
    let b_daemon = Daemon::start(&w.join("b"), &store, t);
    println!(
        "kernel {}, transport {}",
        ublk_core::features::kernel_release(),
        t.name()
    );
    let ctl = Plugin::start(&w.join("ctl"), &store, &["--mode", "controller"]);
    let mut a = Plugin::start(
        &w.join("a"),
        &store,
        &[
            "--mode",
            "node",
            "--node-id",
            "node-a",
            "--state-dir",
            &w.join("a/csi").display().to_string(),
        ],
    );
    let b_args = [
        "--mode",
        "node",
        "--node-id",
        "node-b",
        "--state-dir",
        &w.join("b/csi").display().to_string(),
    ];
    let mut b = Plugin::start(&w.join("b"), &store, &b_args);
    let k = Kube {
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime"),
        work: w.to_path_buf(),
    };

    // 1. On node A: three ledgers, a snapshot of `fs` half way.
    for (name, fs, durability) in VOLUMES {
        create(&k, &ctl, name, fs, durability, None);
    }
    let mut targets = HashMap::new();
    for (name, fs, _) in VOLUMES {
        targets.insert(name, attach(&k, &ctl, &a, "node-a", name, fs));
    }
    let a_devices: Vec<u32> = VOLUMES.iter().map(|v| device_id(&a_daemon, v.0)).collect();
    for (name, fs, _) in VOLUMES {
        ledger_write(&targets[name], fs.is_none(), 0, BEFORE_SNAPSHOT);
    }
    let snap =
        k.rt.block_on(
            k.controller(&ctl)
                .create_snapshot(pb::CreateSnapshotRequest {
                    source_volume_id: "fs".into(),
                    name: "snap-1".into(),
                    ..Default::default()
                }),
        )
        .expect("CreateSnapshot")
        .into_inner()
        .snapshot
        .expect("snapshot");
    println!(
        "snapshot {} of fs taken on node A's daemon",
        snap.snapshot_id
    );
    for (name, fs, _) in VOLUMES {
        ledger_write(&targets[name], fs.is_none(), BEFORE_SNAPSHOT, RECORDS);
    }

    // 2. Node A fails with its disk; the volumes are force-detached and move to node B.
    a_daemon.kill9();
    a.kill9();
    // The node's devices and mounts go with it. A dead server's device holds its I/O
    // (waiting for a recovery that never comes): its STOP fails that I/O, its DEL waits until
    // nothing holds the disk, so the deletes run while the mounts are taken away.
    let deletes: Vec<_> = a_devices
        .into_iter()
        .map(|id| {
            (
                id,
                std::thread::spawn(move || ublk_core::ctrl::delete_device(id)),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    for (name, _, _) in VOLUMES {
        for p in [k.target("node-a", name), k.staging("node-a", name)] {
            let _ = output_within(
                Command::new("umount").args(["-l", &p]),
                Duration::from_secs(60),
            );
        }
    }
    let started = Instant::now();
    for (id, d) in deletes {
        while !d.is_finished() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node A's device {id} is not deleted after 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d.join()
            .expect("delete thread")
            .unwrap_or_else(|e| panic!("delete node A's device {id}: {e}"));
    }
    std::fs::remove_dir_all(w.join("a/data")).expect("discard node A's disk");
    println!("node A killed (daemon and plugin), its disk discarded");
    let mut ctlc = k.controller(&ctl);
    let refused = k.rt.block_on(ctlc.controller_publish_volume(
        pb::ControllerPublishVolumeRequest {
            volume_id: "fs".into(),
            node_id: "node-b".into(),
            volume_capability: Some(capability(Some("ext4"))),
            ..Default::default()
        },
    ));
    assert_eq!(
        refused.expect_err("a second node while A holds it").code(),
        tonic::Code::FailedPrecondition
    );
    for (name, fs, _) in VOLUMES {
        unpublish(&k, &ctl, "node-a", name); // the force detach
        targets.insert(name, attach(&k, &ctl, &b, "node-b", name, fs));
    }

    // 3. What survived.
    for (name, fs, durability) in VOLUMES {
        let n = ledger_read(&targets[name], fs.is_none(), RECORDS);
        println!(
            "{name} (durability {durability}): {n} of {RECORDS} acknowledged records on node B"
        );
        if durability == "store" {
            assert_eq!(
                n, RECORDS,
                "{name}: every acknowledged record survives node A"
            );
        }
    }
    detach(&k, &ctl, &b, "node-b", "loc");
    // `loc` staged as a raw device on B to check its filesystem.
    let dev_path = {
        attach(&k, &ctl, &b, "node-b", "loc", None);
        support::daemon::str_of(&b_daemon.show("loc"), "/device/path").to_string()
    };
    let fsck = run("e2fsck", &["-fn", &dev_path]);
    assert!(
        fsck.status.success(),
        "e2fsck -fn of loc: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    println!("loc: e2fsck -fn clean");
    detach(&k, &ctl, &b, "node-b", "loc");

    // 4. B's plugin restarts with `fs` in use; an expand and a clone through CSI.
    b.kill9();
    b = Plugin::start(&w.join("b"), &store, &b_args);
    let again = attach(&k, &ctl, &b, "node-b", "fs", Some("ext4"));
    assert_eq!(
        again, targets["fs"],
        "the restarted plugin publishes the same target"
    );
    let n = ledger_read(&again, false, RECORDS);
    assert_eq!(n, RECORDS, "fs after B's plugin restarted");
    println!("node B's plugin restarted (kill -9) with fs staged: stage and publish repeated, {n} records read back");
    let stats = |b: &Plugin| {
        k.rt.block_on(
            k.node(b)
                .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                    volume_id: "fs".into(),
                    volume_path: k.target("node-b", "fs"),
                    ..Default::default()
                }),
        )
        .expect("NodeGetVolumeStats")
        .into_inner()
        .usage[0]
            .total
    };
    let before = stats(&b);
    let grown =
        k.rt.block_on(k.controller(&ctl).controller_expand_volume(
            pb::ControllerExpandVolumeRequest {
                volume_id: "fs".into(),
                capacity_range: Some(pb::CapacityRange {
                    required_bytes: 96 * MIB,
                    limit_bytes: 0,
                }),
                volume_capability: Some(capability(Some("ext4"))),
                ..Default::default()
            },
        ))
        .expect("ControllerExpandVolume")
        .into_inner();
    assert_eq!(grown.capacity_bytes, 96 * MIB);
    k.rt.block_on(k.node(&b).node_expand_volume(pb::NodeExpandVolumeRequest {
        volume_id: "fs".into(),
        volume_path: k.target("node-b", "fs"),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 96 * MIB,
            limit_bytes: 0,
        }),
        staging_target_path: k.staging("node-b", "fs"),
        ..Default::default()
    }))
    .expect("NodeExpandVolume");
    let after = stats(&b);
    println!("fs expanded online: filesystem {before} -> {after} bytes");
    assert!(after > before + 16 * MIB, "{before} -> {after}");
    assert_eq!(ledger_read(&targets["fs"], false, RECORDS), RECORDS);

    let source = pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    };
    create(&k, &ctl, "clone", Some("ext4"), "store", Some(source));
    let clone_target = attach(&k, &ctl, &b, "node-b", "clone", Some("ext4"));
    assert_eq!(
        ledger_read(&clone_target, false, RECORDS),
        BEFORE_SNAPSHOT,
        "the clone is the snapshot's moment"
    );
    println!(
        "clone of {}: {BEFORE_SNAPSHOT} records, as at the snapshot",
        snap.snapshot_id
    );

    // Teardown through CSI.
    for name in ["clone", "fs", "blk"] {
        detach(&k, &ctl, &b, "node-b", name);
    }
    let mut ctlc2 = k.controller(&ctl);
    for name in ["clone", "blk", "loc"] {
        k.rt.block_on(ctlc2.delete_volume(pb::DeleteVolumeRequest {
            volume_id: name.into(),
            ..Default::default()
        }))
        .expect("DeleteVolume");
    }
    k.rt.block_on(ctlc2.delete_snapshot(pb::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        ..Default::default()
    }))
    .expect("DeleteSnapshot");
    k.rt.block_on(ctlc2.delete_volume(pb::DeleteVolumeRequest {
        volume_id: "fs".into(),
        ..Default::default()
    }))
    .expect("DeleteVolume fs");
    drop(ctlc);
    drop((a, b, ctl));
    b_daemon.stop();
    ctl_daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn csi_failover_zero_copy() {
    csi_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn csi_failover_user_copy() {
    csi_flow(Transport::UserCopy);
}
