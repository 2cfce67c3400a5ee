//! Kernel tests: queue loops on a shared pool (`LoopPool`) instead of a thread per queue.
//!
//! - Many devices, few threads: 8 two-queue mem devices on a pool of 2 threads; fio verifies
//!   all of them at once; then half are stopped while fio verifies the other half; the pool
//!   ran on its 2 threads only (no per-queue thread was started) and ends empty.
//! - Hand-off on the pool, both ways a loop leaves: QUIESCE_DEV (the kernel aborts the tags)
//!   and the stop flags (the loop's own ring is closed, which cancels its armed FETCHes, while
//!   the other queues of the same thread go on); an open file sees its data before and after.
//! - A request a target never finishes does not stall other devices on the same thread, and
//!   stopping its device stays bounded.
//!
//! Each row says which kernel and transport it ran on.

use std::sync::Arc;
use std::time::Duration;

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks, AlignedBuf, MIB};
use glidefs_testkit::fio::fio;
use glidefs_testkit::process::bounded;
use ublk_core::targets::{DeferPolicy, MemOptions, MemTarget};
use ublk_core::testing::devices::{mem_device_on, preference, StuckWrites};
use ublk_core::{Device, DeviceConfig, DeviceState, LoopPool, Transport};

const SIZE: u64 = 16 * MIB;

fn opts() -> MemOptions {
    MemOptions {
        chunk_bytes: 16 * 1024,
        defer: DeferPolicy::Slow,
    }
}

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// Threads of a queue of its own are named `ublk{dev}-q{queue}`.
fn per_queue_threads() -> Vec<String> {
    thread_names()
        .into_iter()
        .filter(|n| {
            n.strip_prefix("ublk")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()) && r.contains("-q"))
        })
        .collect()
}

fn fio_verify_all(paths: &[String], runtime: &str) {
    let runs: Vec<_> = paths
        .iter()
        .map(|path| {
            let path = path.clone();
            let runtime = runtime.to_string();
            std::thread::spawn(move || {
                fio(
                    &path,
                    &[
                        "--iodepth=16",
                        "--verify=crc32c",
                        "--do_verify=1",
                        &format!("--runtime={runtime}"),
                        "--name=rand4k",
                        "--rw=randwrite",
                        "--bs=4k",
                        "--offset=0",
                        "--size=8M",
                        "--name=seq64k",
                        "--rw=write",
                        "--bs=64k",
                        "--offset=8M",
                        "--size=8M",
                    ],
                )
            })
        })
        .collect();
    for r in runs {
        r.join().expect("fio thread");
    }
}

fn many_devices_few_threads(t: Transport) {
    println!(
        "kernel {} transport {t}",
        ublk_core::features::kernel_release()
    );
    let pool = LoopPool::new(2).expect("pool");
    let devices: Vec<_> = (0..8)
        .map(|_| mem_device_on(t, SIZE, 2, opts(), Some(&pool)).0)
        .collect();
    assert_eq!(pool.queues(), 16, "8 devices x 2 queues on the pool");
    let loops: Vec<_> = thread_names()
        .into_iter()
        .filter(|n| n.starts_with("ublk-loop-"))
        .collect();
    println!("pool threads: {loops:?}");
    assert_eq!(loops.len(), 2, "the pool's threads: {loops:?}");
    assert!(
        per_queue_threads().is_empty(),
        "queue threads of their own started: {:?}",
        per_queue_threads()
    );
    let paths: Vec<String> = devices.iter().map(Device::bdev_path).collect();
    fio_verify_all(&paths, "60");
    // Half stop while fio verifies the other half on the same two threads.
    let mut devices = devices;
    let rest = devices.split_off(4);
    let busy: Vec<String> = rest.iter().map(Device::bdev_path).collect();
    let fio_rest = std::thread::spawn(move || fio_verify_all(&busy, "60"));
    std::thread::sleep(Duration::from_millis(500));
    for dev in devices {
        bounded(
            "stop_and_delete beside busy devices",
            Duration::from_secs(60),
            move || dev.stop_and_delete(),
        )
        .expect("stop");
    }
    assert_eq!(
        pool.queues(),
        8,
        "the stopped devices' queues left the pool"
    );
    fio_rest.join().expect("fio on the devices left");
    for dev in rest {
        bounded("stop_and_delete", Duration::from_secs(60), move || {
            dev.stop_and_delete()
        })
        .expect("stop");
    }
    assert_eq!(pool.queues(), 0);
    assert!(
        ublk_core::list_device_ids().is_empty(),
        "devices left: {:?}",
        ublk_core::list_device_ids()
    );
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_pool_serves_many_devices_on_few_threads() {
    many_devices_few_threads(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_pool_serves_many_devices_on_few_threads() {
    many_devices_few_threads(Transport::UserCopy);
}

/// Hand-off of one device whose queues share a pool thread with a busy device: with
/// QUIESCE_DEV (`quiesce`) or with the stop flags only.
fn pooled_handoff(t: Transport, quiesce: bool) {
    println!(
        "kernel {} transport {t} quiesce {quiesce}",
        ublk_core::features::kernel_release()
    );
    let pool = LoopPool::new(1).expect("pool");
    let (neighbour, _) = mem_device_on(t, SIZE, 1, opts(), Some(&pool));
    let target = MemTarget::new(SIZE, opts()).expect("mem");
    let mut cfg = DeviceConfig::new("mem", SIZE);
    cfg.queues = 2;
    cfg.depth = 64;
    cfg.transport = preference(t);
    cfg.quiesce = quiesce;
    cfg.queue.pool = Some(pool.clone());
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create");
    assert_eq!(dev.transport(), t);
    let path = dev.bdev_path();
    let f = open_direct(&path);
    write_blocks(&f, 7, 0, 1024, 16);
    let neighbour_path = neighbour.bdev_path();
    let busy = std::thread::spawn(move || fio_verify_all(&[neighbour_path], "30"));
    let id = dev.detach().expect("detach");
    assert_eq!(
        pool.queues(),
        1,
        "the detached device's queues left the pool"
    );
    let info = ublk_core::device_info(id).expect("info");
    println!("detached device {id}: state {}", info.state);
    let successor = bounded("recover", Duration::from_secs(60), {
        let (target, queue) = (Arc::clone(&target), cfg.queue.clone());
        move || Device::recover(id, "mem", target, &queue, Duration::from_secs(10))
    })
    .expect("recover");
    assert_eq!(successor.info().expect("info").state, DeviceState::Live);
    assert_eq!(pool.queues(), 3);
    verify_blocks(&f, 0, 1024, 64, |_| Some(7));
    write_blocks(&f, 8, 0, 16, 16);
    verify_blocks(&f, 0, 32, 32, |b| Some(if b < 16 { 8 } else { 7 }));
    drop(f);
    busy.join().expect("fio on the neighbour");
    for dev in [successor, neighbour] {
        bounded("stop_and_delete", Duration::from_secs(60), move || {
            dev.stop_and_delete()
        })
        .expect("stop");
    }
    assert_eq!(pool.queues(), 0);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_pool_handoff_by_quiesce() {
    pooled_handoff(Transport::ZeroCopy, true);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_pool_handoff_by_stop_flags() {
    pooled_handoff(Transport::UserCopy, false);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_pool_handoff_by_stop_flags() {
    pooled_handoff(Transport::ZeroCopy, false);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_pool_a_stuck_request_stalls_no_other_device() {
    let t = Transport::ZeroCopy;
    println!(
        "kernel {} transport {t}",
        ublk_core::features::kernel_release()
    );
    let pool = LoopPool::new(1).expect("pool");
    let (other, _) = mem_device_on(t, SIZE, 1, opts(), Some(&pool));
    let target = StuckWrites::new(8 * MIB);
    let mut cfg = DeviceConfig::new("stuck", 8 * MIB);
    cfg.transport = preference(t);
    cfg.queue.pool = Some(pool.clone());
    let stuck = Device::create(&cfg, Arc::clone(&target)).expect("create");
    let stuck_path = stuck.bdev_path();
    let writer = std::thread::spawn(move || {
        let f = open_direct(&stuck_path);
        let buf = AlignedBuf::new(4096);
        std::os::unix::fs::FileExt::write_at(&f, buf.as_slice(), 0).map(|_| ())
    });
    target.wait_for_a_held_write();
    println!("a WRITE is held on the stuck device; the other device on the same thread runs fio");
    fio_verify_all(&[other.bdev_path()], "30");
    let res = bounded(
        "stop_and_delete with a held request",
        Duration::from_secs(60),
        move || stuck.stop_and_delete(),
    );
    println!("stop returned: {res:?}");
    let write = bounded("stuck writer", Duration::from_secs(30), move || {
        writer.join().expect("writer")
    });
    assert!(
        write.is_err(),
        "a write the target never finished must not succeed"
    );
    // The other device still serves after its neighbour's stop.
    fio_verify_all(&[other.bdev_path()], "10");
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        other.stop_and_delete()
    })
    .expect("stop");
    assert_eq!(pool.queues(), 0);
    target.release(4096);
}
