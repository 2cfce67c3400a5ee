//! Kernel test of snapshots and clones through the real daemon, on both transports:
//!
//! 1. A snapshot taken while fio writes (with crc32c verify) to the second half: the
//!    other half, written before with a known pattern and overwritten after the snapshot,
//!    reads the old pattern through the snapshot attached read-only (its own device; writes
//!    to it fail) and the new one through the volume; the attachment's whole content does not
//!    change while fio goes on and the whole volume is overwritten; fio's verify passes.
//! 2. A clone boots the ext4 of a snapshot taken while mounted: it mounts (journal replayed
//!    on the clone), has the files of that point and not the origin's later one; each side
//!    then writes a file the other never sees; `e2fsck -fn` is clean on both; the snapshot
//!    cannot be deleted while the clone uses it.
//! 3. Deleting a snapshot releases its packs: compaction and GC (grace 0, one manifest kept)
//!    leave the store at least the overwritten half smaller after the delete than before.
//!    The clone's origin, collected as hard, still serves the clone recreated cold.
//! 4. kill -9 of the daemon during snapshot create, snapshot delete and clone create: after
//!    the restart (devices recovered) the acknowledged writes read back, the operation
//!    retried completes, and the snapshot and the clone read their point in time after
//!    compaction and the hardest GC.
//!
//! Needs /dev/ublk-control, fio, mkfs.ext4, e2fsck: `scripts/test` runs it under
//! `scripts/ublk-vm`. A missing tool fails the test with its name.

mod support;

use std::fs::OpenOptions;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Duration;

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks, AlignedBuf, BLOCK};
use glidefs_testkit::pattern::noise;
use ublk_core::Transport;

use support::daemon::{default_config, device_of, fio_verify, run, u64_of, Daemon, Mount, Store};

const MIB: u64 = 1 << 20;
/// The device: the first half is written by the test, the second by fio.
const SIZE: u64 = 64 * MIB;
const HALF_BLOCKS: u64 = SIZE / 2 / BLOCK as u64;

/// A hash of the whole device, read with O_DIRECT through a read-only descriptor.
fn digest(dev: &str) -> u64 {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {dev} read-only: {e}"));
    let mut buf = AlignedBuf::new(MIB as usize);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for off in (0..SIZE).step_by(MIB as usize) {
        f.read_exact_at(buf.as_mut_slice(), off)
            .unwrap_or_else(|e| panic!("read {dev} at {off}: {e}"));
        buf.as_slice().hash(&mut h);
    }
    h.finish()
}

fn snapshot_under_fio(daemon: &Daemon, t: Transport) {
    let info = daemon.json(&["create", "vol", "--size", "64M"]);
    let dev = device_of(&info, t);
    let f = open_direct(&dev);
    write_blocks(&f, 1, 0, HALF_BLOCKS, 64);
    let fio = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            fio_verify(
                &dev,
                "under-snapshot",
                &[
                    "--rw=randwrite",
                    "--bs=4k",
                    "--iodepth=8",
                    "--offset=32M",
                    "--size=8M",
                ],
                false,
                Duration::from_secs(240),
            )
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let snap = daemon.snapshot(&["create", "vol", "s1"]);
    println!("snapshot taken while fio writes: {snap}");
    assert!(u64_of(&snap, "/generation") >= 2, "{snap}");
    // The volume moves on.
    write_blocks(&f, 2, 0, HALF_BLOCKS, 64);
    let att = daemon.snapshot(&["attach", "vol@s1", "vol-s1"]);
    let ro = device_of(&att, t);
    assert_eq!(att["read_only"], true, "{att}");
    assert_eq!(att["snapshot"], "vol@s1", "{att}");
    let before = digest(&ro);
    let rof = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&ro)
        .expect("open the attachment");
    verify_blocks(&rof, 0, HALF_BLOCKS, 64, |_| Some(1));
    verify_blocks(&f, 0, HALF_BLOCKS, 64, |_| Some(2));
    println!("first half: the attachment reads the pattern of the snapshot's point, the volume the newer one");
    let denied = OpenOptions::new().write(true).open(&ro).and_then(|w| {
        let buf = vec![0u8; BLOCK];
        w.write_all_at(&buf, 0)?;
        w.sync_all()
    });
    assert!(
        denied.is_err(),
        "a write to the read-only attachment succeeded"
    );
    println!("writing to the attachment fails: {}", denied.unwrap_err());
    let job = fio.join().expect("fio thread");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap_or(0) >= 8 * MIB,
        "fio verified everything it wrote: {job}"
    );
    // And the whole volume moves on once more.
    write_blocks(&f, 3, HALF_BLOCKS, HALF_BLOCKS, 64);
    let after = digest(&ro);
    assert_eq!(
        before, after,
        "the attachment changed while the volume was written"
    );
    println!("the attachment's content did not move while fio wrote the volume");
    drop(rof);
    daemon.json(&["rm", "vol-s1"]);
}

fn clone_boots_and_diverges(daemon: &Daemon, work: &std::path::Path, t: Transport) {
    let info = daemon.json(&["create", "base", "--size", "128M"]);
    let dev = device_of(&info, t);
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("f{i}.bin"), noise(700 + i, 2 << 20)))
        .collect();
    let mnt = work.join("base");
    let m = Mount::new(&dev, &mnt);
    for (name, data) in &files {
        std::fs::write(mnt.join(name), data).expect("write a file");
    }
    run("sync", &[]);
    // Taken while mounted: a crash-consistent point, like a power cut.
    daemon.snapshot(&["create", "base", "gold"]);
    std::fs::write(mnt.join("after.bin"), noise(1, 1 << 20)).expect("write after");
    run("sync", &[]);

    let info = daemon.json(&["create", "clone1", "--from", "base@gold"]);
    let cdev = device_of(&info, t);
    let cmnt = work.join("clone1");
    let c = Mount::new(&cdev, &cmnt);
    for (name, want) in &files {
        let got = std::fs::read(cmnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *want, "clone: {name} differs from the snapshot's");
    }
    assert!(
        !cmnt.join("after.bin").exists(),
        "the clone sees a file written after its snapshot"
    );
    std::fs::write(cmnt.join("clone-only.bin"), noise(2, 1 << 20)).expect("write on the clone");
    std::fs::write(mnt.join("base-only.bin"), noise(3, 1 << 20)).expect("write on the base");
    run("sync", &[]);
    assert!(!mnt.join("clone-only.bin").exists() && !cmnt.join("base-only.bin").exists());
    println!("clone booted the snapshot's ext4; base and clone each see only their own writes");
    c.unmount();
    m.unmount();
    run("e2fsck", &["-fn", &dev]);
    run("e2fsck", &["-fn", &cdev]);
    let refused = daemon.command("snapshot", &["delete", "base", "gold"]);
    let msg = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        !refused.status.success() && msg.contains("clone1"),
        "deleting a snapshot a clone uses: {refused:?}"
    );
    println!("snapshot delete refused: {}", msg.trim());
}

fn delete_releases_packs(daemon: &Daemon, work: &std::path::Path, t: Transport) {
    let pinned = daemon.json(&["compact", "vol"]);
    let s1 = u64_of(&pinned, "/stored_bytes");
    daemon.snapshot(&["delete", "vol", "s1"]);
    let freed = daemon.json(&["compact", "vol"]);
    let s2 = u64_of(&freed, "/stored_bytes");
    println!("store of vol: {s1} bytes with the snapshot, {s2} after deleting it");
    assert!(
        s1 >= s2 + 16 * MIB,
        "deleting the snapshot released too little: {s1} -> {s2} bytes"
    );
    let f = open_direct(&device_of(&daemon.show("vol"), t));
    verify_blocks(&f, 0, HALF_BLOCKS, 64, |_| Some(2));

    // The clone's origin collected as hard as it goes: the clone, recreated cold, still reads.
    daemon.json(&["compact", "base"]);
    daemon.json(&["rm", "clone1"]);
    let info = daemon.json(&["create", "clone1", "--attach-existing"]);
    let cdev = device_of(&info, t);
    run("e2fsck", &["-fn", &cdev]);
    let cmnt = work.join("clone1");
    let c = Mount::new(&cdev, &cmnt);
    for i in 0..4 {
        let name = format!("f{i}.bin");
        let got = std::fs::read(cmnt.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == noise(700 + i, 2 << 20), "cold clone: {name} differs");
    }
    c.unmount();
    println!("after GC of its origin, the clone recreated cold reads its files back");
    daemon.json(&["rm", "clone1", "--purge"]);
    daemon.snapshot(&["delete", "base", "gold"]);
}

/// Runs `glidefs ARGS --json` in a thread, kills the daemon `after` into it (SIGKILL), starts
/// a new one (which recovers the devices) and returns it with the call's output.
fn kill_during(
    daemon: Daemon,
    args: &[&str],
    after: Duration,
    restart: impl FnOnce() -> Daemon,
) -> (Daemon, std::process::Output) {
    let socket = daemon.socket.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let call = std::thread::spawn(move || {
        std::process::Command::new(support::daemon::glidefs())
            .args(&args)
            .arg("--json")
            .arg("--socket")
            .arg(socket)
            .output()
            .expect("run glidefs")
    });
    std::thread::sleep(after);
    daemon.kill9();
    let out = call.join().expect("the call");
    (restart(), out)
}

/// Reads the first half of `dev` (read-only) and checks it is generation `gen`.
fn check_first_half(dev: &str, gen: u64) {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {dev}: {e}"));
    verify_blocks(&f, 0, HALF_BLOCKS, 64, |_| Some(gen));
}

/// kill -9 during snapshot create, snapshot delete and clone create: after each restart the
/// acknowledged (and FLUSHed) writes read back, a snapshot that exists reads its point in
/// time, a clone that exists reads its snapshot's data, also after compaction and the
/// hardest GC; an interrupted operation completes when retried.
fn kill9_during_snapshot_ops(
    mut daemon: Daemon,
    work: &std::path::Path,
    config: &str,
    store: &Store,
    t: Transport,
) -> Daemon {
    let dev = device_of(&daemon.show("vol"), t);
    let f = open_direct(&dev);
    write_blocks(&f, 10, 0, HALF_BLOCKS, 64);
    f.sync_all().expect("FLUSH");
    daemon.snapshot(&["create", "vol", "k0"]);
    drop(f);
    let ops: [(&[&str], u64); 3] = [
        (&["snapshot", "create", "vol", "k1"], 80),
        (&["snapshot", "delete", "vol", "k0"], 30),
        (&["volume", "create", "kc", "--from", "vol@k1"], 150),
    ];
    for (i, (args, ms)) in ops.into_iter().enumerate() {
        let f = open_direct(&dev);
        let gen = 11 + i as u64;
        write_blocks(&f, gen, 0, HALF_BLOCKS, 64);
        f.sync_all().expect("FLUSH");
        drop(f);
        let (d, out) = kill_during(daemon, args, Duration::from_millis(ms), || {
            Daemon::start_with_config(work, config, store, t)
        });
        daemon = d;
        println!(
            "kill -9 {ms} ms into `glidefs {}`: the call {}",
            args.join(" "),
            if out.status.success() {
                "had completed"
            } else {
                "was cut"
            }
        );
        assert_eq!(device_of(&daemon.show("vol"), t), dev, "device changed");
        check_first_half(&dev, gen);
        // Retry what was cut, the way an operator would.
        match i {
            0 => {
                let r = daemon.command("snapshot", &["create", "vol", "k1"]);
                let err = String::from_utf8_lossy(&r.stderr);
                assert!(
                    r.status.success() || err.contains("snapshot_exists"),
                    "retrying the snapshot: {err}"
                );
            }
            1 => {
                let r = daemon.command("snapshot", &["delete", "vol", "k0"]);
                let err = String::from_utf8_lossy(&r.stderr);
                assert!(
                    r.status.success() || err.contains("snapshot_not_found"),
                    "retrying the delete: {err}"
                );
            }
            _ => {
                let listed = daemon.cli(&["show", "kc"]).status.success();
                if !listed {
                    let r = daemon.command("volume", &["create", "kc", "--from", "vol@k1"]);
                    if !r.status.success() {
                        let err = String::from_utf8_lossy(&r.stderr);
                        assert!(err.contains("volume_exists_in_store"), "{err}");
                        daemon.json(&["create", "kc", "--attach-existing"]);
                    }
                }
            }
        }
        // Collected as hard as it goes, then k1 (the first half at generation 11) still
        // reads back, through an attachment and, once it exists, through the clone.
        daemon.json(&["compact", "vol"]);
        let att = daemon.snapshot(&["attach", "vol@k1", "vol-k1"]);
        check_first_half(&device_of(&att, t), 11);
        daemon.json(&["rm", "vol-k1"]);
        if i == 2 {
            check_first_half(&device_of(&daemon.show("kc"), t), 11);
        }
    }
    let list = daemon.snapshot(&["list", "vol"]);
    let names: Vec<&str> = list["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["k1"], "{list}");
    // The clone, cold from the store after its origin's GC.
    daemon.json(&["rm", "kc"]);
    let info = daemon.json(&["create", "kc", "--attach-existing"]);
    check_first_half(&device_of(&info, t), 11);
    daemon.json(&["rm", "kc", "--purge"]);
    daemon.snapshot(&["delete", "vol", "k1"]);
    println!("kill -9 during snapshot create, delete and clone create: nothing lost");
    daemon
}

fn snapshot_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let config = format!(
        "{}[gc]\ngrace_secs = 0\nkeep_manifests = 1\nallow_short_grace = true\n\
         [space]\ncompact_interval_secs = 0\ngc_interval_secs = 0\n",
        default_config(work.path(), &store)
    );
    println!("=== snapshots and clones on the local store, {t}");
    let daemon = Daemon::start_with_config(work.path(), &config, &store, t);
    snapshot_under_fio(&daemon, t);
    clone_boots_and_diverges(&daemon, work.path(), t);
    delete_releases_packs(&daemon, work.path(), t);
    let daemon = kill9_during_snapshot_ops(daemon, work.path(), &config, &store, t);
    daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn snapshots_and_clones_zero_copy() {
    snapshot_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn snapshots_and_clones_user_copy() {
    snapshot_flow(Transport::UserCopy);
}
