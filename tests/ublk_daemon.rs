//! Kernel tests of the daemon: the real `glidefs serve` binary with ublk devices, driven
//! through its CLI exactly as an operator would, on both transports (zero-copy, and USER_COPY
//! forced with `GLIDEFS_FORCE_USER_COPY=1`, checked through the API's `device.transport`).
//!
//! - `daemon_demo_*`: the README demo as a test, on the embedded local-directory store and on
//!   a real S3 protocol server (in-process, plain HTTP + SigV4): ext4 on a new volume, files
//!   written; the daemon restarted (SIGTERM, start again: the volume comes back from
//!   state.json with its device and data); flush; `volume rm` (its cache directory deleted,
//!   the device gone); `volume create --attach-existing` recreates it cold from the store;
//!   `e2fsck -fn` is clean and every file reads back identical; `rm` and `rm --purge` of the
//!   mounted volume are refused (`device_busy`) and change nothing, as is `rm` of the device
//!   held open by a plain `open(2)` (SAFE_STOP_DEV); `rm --purge` empties the store.
//! - `daemon_fio_*`: fio `--verify=crc32c` (4k randwrite, 128k sequential write, 4k randrw)
//!   with a 1 MiB flush threshold so flushes run during the load; then the volume is removed,
//!   recreated cold and fio's verify-only pass over the same regions passes.
//! - `daemon_features_*`: `glidefs features --json` reports zero-copy, and user-copy with the
//!   override.
//! - `daemon_queue_threads_*`: of 8 two-queue volumes, those whose queues fit in
//!   `own_thread_queues` (default: one per CPU) get a thread per queue, the rest are served
//!   by the shared loop pool (one thread per CPU, `ublk-loop-N`); each device's data reads
//!   back, also after half the volumes were removed; a volume created then gets the threads
//!   the removed ones gave back.
//!
//! Needs /dev/ublk-control, mkfs.ext4, e2fsck and fio: `scripts/test` runs it under
//! `scripts/ublk-vm`. A missing tool fails the test with its name (nothing is skipped).

mod support;

use support::daemon;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_testkit::pattern::noise;
use serde_json::Value;
use ublk_core::Transport;

use daemon::{device_of, fio_verify, glidefs, run, str_of, u64_of, Daemon, Mount, Store};

/// A fio run taking longer than this under emulation is a hang.
const FIO_LIMIT: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------
// The demo flow

/// Content of the files the demo writes: (relative path, bytes).
fn demo_files() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("big{i}.bin"), noise(100 + i, 6 << 20)))
        .collect();
    for j in 0..48u64 {
        let len = usize::try_from((j * 7919) % 40_000 + 1).expect("len");
        files.push((format!("small/f{j:02}"), noise(j + 1, len)));
    }
    files
}

fn write_files(root: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(root.join("small")).expect("mkdir");
    for (name, data) in files {
        std::fs::write(root.join(name), data).expect("write a file");
    }
    run("sync", &[]);
}

fn check_files(root: &Path, files: &[(String, Vec<u8>)], what: &str) {
    for (name, want) in files {
        let got = std::fs::read(root.join(name)).unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        assert!(
            got == *want,
            "{what}: {name} differs ({} bytes read, {} written)",
            got.len(),
            want.len()
        );
    }
    let bytes: usize = files.iter().map(|(_, d)| d.len()).sum();
    println!(
        "{what}: {} files ({bytes} bytes) read back identical",
        files.len()
    );
}

fn demo_flow(store_kind: &str, t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = match store_kind {
        "s3" => Store::s3(),
        _ => Store::local(work.path()),
    };
    let mnt = work.path().join("mnt");
    let files = demo_files();
    println!("=== demo on {store_kind} store ({}), {t}", store.url());

    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "demo", "--size", "256M"]);
    let dev = device_of(&info, t);
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let m = Mount::new(&dev, &mnt);
    write_files(&mnt, &files);
    m.unmount();

    // Restart (shutdown closes the volume cleanly): the volume comes back from state.json.
    daemon.stop();
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.show("demo");
    assert_eq!(str_of(&info, "/state"), "running", "{info}");
    let dev = device_of(&info, t);
    let m = Mount::new(&dev, &mnt);
    check_files(&mnt, &files, "after a daemon restart");
    m.unmount();

    let report = daemon.json(&["flush", "demo"]);
    println!("flush: {report}");
    let info = daemon.show("demo");
    assert_eq!(u64_of(&info, "/dirty_bytes"), 0, "{info}");
    assert_eq!(u64_of(&info, "/syncing_bytes"), 0, "{info}");
    let cache_dir = str_of(&info, "/cache_dir").to_string();
    assert!(Path::new(&cache_dir).is_dir(), "{cache_dir}");

    let out = daemon.json(&["rm", "demo"]);
    println!("rm: {out}");
    assert!(
        !Path::new(&cache_dir).exists(),
        "the local cache {cache_dir} survived `volume rm`"
    );
    assert!(!Path::new(&dev).exists(), "{dev} survived `volume rm`");
    let stored = store.objects("demo");
    assert!(stored > 0, "nothing in the store after rm");
    println!("removed: cache dir and {dev} gone, {stored} objects in the store");

    let info = daemon.json(&["create", "demo", "--attach-existing"]);
    assert_eq!(u64_of(&info, "/size"), 256 << 20, "{info}");
    assert!(u64_of(&info, "/remote_blocks") > 0, "not cold: {info}");
    let dev = device_of(&info, t);
    let fsck = run("e2fsck", &["-fn", &dev]);
    println!(
        "e2fsck -fn on the cold volume: clean\n{}",
        String::from_utf8_lossy(&fsck.stdout).trim_end()
    );
    let m = Mount::new(&dev, &mnt);
    check_files(&mnt, &files, "recreated cold from the store");
    refuses_removal_while_in_use(&daemon, &dev, &mnt, &files, m);
    let info = daemon.show("demo");
    let cold = u64_of(&info, "/cold_reads");
    assert!(cold > 0, "no block came from the store: {info}");
    println!("cold reads (blocks fetched from the store): {cold}");

    daemon.json(&["rm", "demo", "--purge"]);
    assert_eq!(store.objects("demo"), 0, "rm --purge left objects behind");
    daemon.stop();
}

/// `volume rm` (plain and `--purge`) of the mounted volume is refused with `device_busy` and
/// changes nothing (the files still read back after the refusals); unmounted but held open by
/// a plain `open(2)`, it is refused too where the kernel has SAFE_STOP_DEV (TRY_STOP_DEV),
/// which this kernel must have (7.0+; the O_EXCL fallback sees mounts only).
fn refuses_removal_while_in_use(
    daemon: &Daemon,
    dev: &str,
    mnt: &Path,
    files: &[(String, Vec<u8>)],
    m: Mount,
) {
    let refused = |args: &[&str], what: &str| {
        let out = daemon.cli(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains("device_busy") && err.contains(dev),
            "{what}: `volume {args:?}` was not refused as device_busy naming {dev}: {out:?}\n{}",
            daemon.log_text()
        );
        println!(
            "{what}: `volume {}` refused: {}",
            args.join(" "),
            err.trim()
        );
    };
    refused(&["rm", "demo"], "mounted");
    refused(&["rm", "demo", "--purge"], "mounted");
    assert_eq!(str_of(&daemon.show("demo"), "/state"), "running");
    check_files(mnt, files, "after the refused removes");
    m.unmount();
    let v = features(false);
    let safe_stop = v["safe_stop"] == Value::Bool(true);
    assert!(
        safe_stop,
        "kernel {} lacks SAFE_STOP_DEV, which the VM kernel (7.0+) has: {v}",
        v["kernel"]
    );
    let held = std::fs::File::open(dev).expect("open the device");
    refused(&["rm", "demo"], "held open (SAFE_STOP_DEV, TRY_STOP_DEV)");
    drop(held);
    assert_eq!(str_of(&daemon.show("demo"), "/state"), "running");
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_demo_local_store_zero_copy() {
    demo_flow("local", Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_demo_local_store_user_copy() {
    demo_flow("local", Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_demo_s3_zero_copy() {
    demo_flow("s3", Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_demo_s3_user_copy() {
    demo_flow("s3", Transport::UserCopy);
}

// ---------------------------------------------------------------------------------------
// fio verify with flushes, then verify-only after a cold recreate

/// The fio jobs: name and workload arguments (each on its own region of the volume).
const FIO_JOBS: [(&str, &[&str]); 3] = [
    (
        "randwrite4k",
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--offset=0",
            "--size=12M",
            "--iodepth=16",
        ],
    ),
    (
        "seqwrite128k",
        &[
            "--rw=write",
            "--bs=128k",
            "--offset=16M",
            "--size=16M",
            "--iodepth=4",
        ],
    ),
    (
        "randrw4k",
        &[
            "--rw=randrw",
            "--bs=4k",
            "--offset=32M",
            "--size=12M",
            "--iodepth=8",
        ],
    ),
];

/// One fio job with crc32c verification; `verify_only` re-checks a previous run's data.
/// Returns (bytes written, bytes read) as fio reports them.
fn fio(dev: &str, name: &str, job: &[&str], verify_only: bool) -> (u64, u64) {
    let job = fio_verify(dev, name, job, verify_only, FIO_LIMIT);
    let wr = job["write"]["io_bytes"].as_u64().unwrap_or(0);
    let rd = job["read"]["io_bytes"].as_u64().unwrap_or(0);
    (wr, rd)
}

/// WRITE requests the block layer completed on `dev` (`/sys/block/NAME/stat`, field 5).
fn writes_completed(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
        .unwrap_or_else(|e| panic!("/sys/block/{name}/stat: {e}"));
    stat.split_whitespace()
        .nth(4)
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("/sys/block/{name}/stat: {stat}"))
}

fn fio_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    println!("=== fio verify on a glidefs volume, {t}");
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "fio", "--size", "64M"]);
    let dev = device_of(&info, t);
    // Besides the flusher (1 MiB threshold, checked every second), requested flushes every
    // 250 ms, so that uploads and manifest rotations certainly overlap the load.
    let stop = Arc::new(AtomicBool::new(false));
    let requester = {
        let (stop, socket) = (Arc::clone(&stop), daemon.socket.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Acquire) {
                let out = Command::new(glidefs())
                    .args(["volume", "flush", "fio", "--socket"])
                    .arg(&socket)
                    .output()
                    .expect("run glidefs volume flush");
                assert!(out.status.success(), "flush during fio: {out:?}");
                n += 1;
                std::thread::sleep(Duration::from_millis(250));
            }
            n
        })
    };
    for (name, job) in FIO_JOBS {
        let (wr, rd) = fio(&dev, name, job, false);
        assert!(wr > 0 && rd > 0, "{name}: nothing written or verified");
    }
    stop.store(true, Ordering::Release);
    let requested = requester.join().expect("flush requester");
    let info = daemon.show("fio");
    let flushes = u64_of(&info, "/flush/count");
    let flushed = u64_of(&info, "/flush/bytes");
    println!(
        "flushes to the store during the fio run: {flushes} ({flushed} bytes), \
         {requested} requested"
    );
    assert!(requested >= 2, "flushes should overlap the load: {info}");
    assert!(flushes >= 2, "{info}");
    assert_eq!(u64_of(&info, "/flush/errors"), 0, "{info}");

    daemon.json(&["rm", "fio"]);
    let info = daemon.json(&["create", "fio", "--attach-existing"]);
    assert!(u64_of(&info, "/remote_blocks") > 0, "not cold: {info}");
    let dev = device_of(&info, t);
    for (name, job) in FIO_JOBS {
        // fio's JSON counts the writes a verify-only pass replays without issuing them: the
        // block layer's own counter shows nothing was written.
        let before = writes_completed(&dev);
        let (_, rd) = fio(&dev, name, job, true);
        assert_eq!(
            writes_completed(&dev),
            before,
            "{name}: the verify-only pass wrote"
        );
        assert!(rd > 0, "{name}: the verify-only pass verified nothing");
    }
    let info = daemon.show("fio");
    assert!(u64_of(&info, "/cold_reads") > 0, "{info}");
    println!(
        "verify-only after a cold recreate passed; {} blocks fetched from the store",
        u64_of(&info, "/cold_reads")
    );
    // As root in the VM (CAP_SYS_RESOURCE) every thread of the daemon's runtime was marked
    // IO_FLUSHER at its start (`glidefs::ublk::runtime`); any failure is logged.
    let log = daemon.log_text();
    if let Some(line) = log.lines().find(|l| l.contains("IO_FLUSHER")) {
        panic!("the daemon's runtime threads are not all IO_FLUSHERs: {line}");
    }
    daemon.json(&["rm", "fio", "--purge"]);
    daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_fio_zero_copy() {
    fio_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_fio_user_copy() {
    fio_flow(Transport::UserCopy);
}

// ---------------------------------------------------------------------------------------
// features

fn features(force_user_copy: bool) -> Value {
    let mut cmd = Command::new(glidefs());
    cmd.args(["features", "--json"])
        .env_remove("GLIDEFS_FORCE_USER_COPY");
    if force_user_copy {
        cmd.env("GLIDEFS_FORCE_USER_COPY", "1");
    }
    let out = cmd.output().expect("run glidefs features");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("features --json is JSON")
}

/// Names of the threads of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the daemon's /proc/PID/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// (pool threads, threads of a queue of their own) of the daemon.
fn queue_threads(pid: u32) -> (usize, usize) {
    let names = thread_names(pid);
    let pool = names.iter().filter(|n| n.starts_with("ublk-loop-")).count();
    let own = names
        .iter()
        .filter(|n| {
            n.strip_prefix("ublk")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()) && r.contains("-q"))
        })
        .count();
    (pool, own)
}

/// `queue_threads` (pool, own) once it is `want`, or as it is after 10 s (queue threads
/// end shortly after their device's stop returned).
fn wait_for_queue_threads(pid: u32, want: (usize, usize)) -> (usize, usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = queue_threads(pid);
        if now == want || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_queue_threads_do_not_grow_with_devices() {
    use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks};
    let t = Transport::ZeroCopy;
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let daemon = Daemon::start(work.path(), &store, t);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut devices = Vec::new();
    for i in 0..8u64 {
        let name = format!("v{i}");
        let info = daemon.json(&["create", &name, "--size", "16M"]);
        let dev = device_of(&info, t);
        write_blocks(&open_direct(&dev), 100 + i, 0, 256, 16);
        devices.push((name, dev, i));
    }
    let (pool, own) = queue_threads(daemon.pid());
    println!(
        "8 volumes x 2 queues: {pool} pool threads, {own} threads of a queue's own, {cpus} cpus"
    );
    // The first volumes whose 2 queues fit in `own_thread_queues` (one per CPU) have threads
    // of their own; the others share the pool.
    let share = (cpus.clamp(1, 32) / 2 * 2).min(16);
    assert_eq!(
        own, share,
        "threads of their own for the first {share} queues"
    );
    let pooled = if share < 16 { cpus.clamp(1, 32) } else { 0 };
    assert_eq!(pool, pooled, "one pool thread per CPU");
    for (_, dev, i) in &devices {
        verify_blocks(&open_direct(dev), 0, 256, 32, |_| Some(100 + i));
    }
    for (name, _, _) in devices.drain(..4) {
        let out = daemon.cli(&["rm", &name]);
        assert!(out.status.success(), "volume rm {name}: {out:?}");
    }
    // v0 (threads of its own, while any) is gone: its threads ended, the pool stays.
    let left = (pool, share.saturating_sub(8));
    assert_eq!(
        wait_for_queue_threads(daemon.pid(), left),
        left,
        "(pool, own) after 4 removes"
    );
    for (_, dev, i) in &devices {
        verify_blocks(&open_direct(dev), 0, 256, 32, |_| Some(100 + i));
    }
    // A volume created now gets the queues the removed ones gave back.
    let info = daemon.json(&["create", "v8", "--size", "16M"]);
    let dev = device_of(&info, t);
    write_blocks(&open_direct(&dev), 108, 0, 256, 16);
    let want = (pool, (share.saturating_sub(8) + 2).min(share));
    assert_eq!(
        wait_for_queue_threads(daemon.pid(), want),
        want,
        "(pool, own) after v8"
    );
    verify_blocks(&open_direct(&dev), 0, 256, 32, |_| Some(108));
    daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn daemon_features_report_zero_copy_and_the_override() {
    let v = features(false);
    println!("glidefs features --json: {v}");
    assert_eq!(v["ublk_available"], Value::Bool(true), "{v}");
    assert_eq!(v["zero_copy"], Value::Bool(true), "{v}");
    assert_eq!(v["transport"], "zero-copy", "{v}");
    let v = features(true);
    println!("with GLIDEFS_FORCE_USER_COPY=1: {v}");
    assert_eq!(v["force_user_copy"], Value::Bool(true), "{v}");
    assert_eq!(v["transport"], "user-copy", "{v}");
}
