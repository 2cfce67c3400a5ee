//! Kernel tests: `UBLK_F_BATCH_IO` on and off on the same kernel, in the same run.
//!
//! - fio verify through a 2-queue mem device with batch on and with batch off, on both
//!   transports (zero-copy AUTO_BUF_REG, forced USER_COPY), on a thread per queue and on a
//!   shared loop pool: 8 rows.
//! - Hand-off under load with batch on: fio verifies a device while it is detached and
//!   recovered by a successor; the requests in flight at the hand-off are reissued to the
//!   successor and fio's verify passes. A batch device is never given `UBLK_F_QUIESCE`
//!   (on 7.3.4, QUIESCE_DEV left the batch queues force-aborted: every request after the
//!   recovery failed with EIO), so asking for quiesce hands off with the stop flags too.
//!
//! Each row prints the kernel, transport, batch mode and where the queues run. A kernel
//! without BATCH_IO (before 7.0) skips the batch-on rows with a message (the off rows still
//! run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_testkit::blockdev::MIB;
use glidefs_testkit::fio::fio;
use glidefs_testkit::process::bounded;
use ublk_core::features::{kernel_release, KernelFeatures};
use ublk_core::targets::{DeferPolicy, MemOptions, MemTarget};
use ublk_core::testing::devices::{mem_device_batch, preference};
use ublk_core::{BatchIo, Device, DeviceConfig, DeviceState, LoopPool, Transport};

const SIZE: u64 = 32 * MIB;

fn opts() -> MemOptions {
    MemOptions {
        chunk_bytes: 16 * 1024,
        defer: DeferPolicy::Slow,
    }
}

/// Whether the running kernel can do the row; prints why not.
fn kernel_has_batch(batch: BatchIo) -> bool {
    let f = KernelFeatures::probe().expect("ublk features");
    if batch == BatchIo::On && !f.batch_io() {
        println!(
            "kernel {} has no UBLK_F_BATCH_IO (features {f}): batch-on row skipped",
            kernel_release()
        );
        return false;
    }
    true
}

fn fio_row(t: Transport, pooled: bool, batch: BatchIo) {
    let on = if pooled { "pool" } else { "thread-per-queue" };
    println!(
        "row: kernel {} transport {t} batch_io {batch} queues on {on}",
        kernel_release()
    );
    if !kernel_has_batch(batch) {
        return;
    }
    let pool = pooled.then(|| LoopPool::new(1).expect("pool"));
    let (dev, target) = mem_device_batch(t, SIZE, 2, opts(), pool.as_ref(), batch);
    let start = Instant::now();
    fio(
        &dev.bdev_path(),
        &[
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--runtime=120",
            "--name=rand4k",
            "--rw=randwrite",
            "--bs=4k",
            "--offset=0",
            "--size=8M",
            "--name=seq128k",
            "--rw=write",
            "--bs=128k",
            "--offset=8M",
            "--size=16M",
            "--name=mixed",
            "--rw=randrw",
            "--bsrange=4k-64k",
            "--offset=24M",
            "--size=8M",
        ],
    );
    let stats = target.stats();
    let r = stats.reads.load(std::sync::atomic::Ordering::Relaxed);
    let w = stats.writes.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "result: kernel {} transport {t} batch_io {batch} on {on}: fio verify passed, {r} reads {w} writes in {:.1} s",
        kernel_release(),
        start.elapsed().as_secs_f64()
    );
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        dev.stop_and_delete()
    })
    .expect("stop and delete");
    if let Some(pool) = pool {
        assert_eq!(pool.queues(), 0, "the device's queues left the pool");
    }
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_zero_copy_thread_fio_verify_on_and_off() {
    fio_row(Transport::ZeroCopy, false, BatchIo::On);
    fio_row(Transport::ZeroCopy, false, BatchIo::Off);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_user_copy_thread_fio_verify_on_and_off() {
    fio_row(Transport::UserCopy, false, BatchIo::On);
    fio_row(Transport::UserCopy, false, BatchIo::Off);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_zero_copy_pool_fio_verify_on_and_off() {
    fio_row(Transport::ZeroCopy, true, BatchIo::On);
    fio_row(Transport::ZeroCopy, true, BatchIo::Off);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_user_copy_pool_fio_verify_on_and_off() {
    fio_row(Transport::UserCopy, true, BatchIo::On);
    fio_row(Transport::UserCopy, true, BatchIo::Off);
}

/// fio verifies a batch-on device while it is handed to a successor (QUIESCE_DEV when
/// `quiesce`, else the stop flags alone); the queues run on a pool when `pooled`.
fn handoff_under_load(t: Transport, pooled: bool, quiesce: bool) {
    let on = if pooled { "pool" } else { "thread-per-queue" };
    println!(
        "row: kernel {} transport {t} batch_io on queues on {on}: hand-off under load, quiesce {quiesce}",
        kernel_release()
    );
    if !kernel_has_batch(BatchIo::On) {
        return;
    }
    let pool = pooled.then(|| LoopPool::new(1).expect("pool"));
    let target = MemTarget::new(SIZE, opts()).expect("mem");
    let mut cfg = DeviceConfig::new("mem", SIZE);
    cfg.queues = 2;
    cfg.depth = 64;
    cfg.transport = preference(t);
    cfg.quiesce = quiesce;
    cfg.queue.pool = pool.clone();
    cfg.queue.batch_io = BatchIo::On;
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create");
    let info = dev.info().expect("info");
    assert_eq!(dev.transport(), t);
    assert_ne!(info.flags & libublk::sys::UBLK_F_BATCH_IO as u64, 0);
    let quiesce_granted = info.flags & libublk::sys::UBLK_F_QUIESCE as u64 != 0;
    println!(
        "device {} flags {:#x} (QUIESCE granted: {quiesce_granted})",
        dev.bdev_path(),
        info.flags,
    );
    assert!(
        !quiesce_granted,
        "a batch device hands off with the stop flags"
    );
    let path = dev.bdev_path();
    // Write then verify, time-limited: the hand-off lands in the write phase.
    let load = std::thread::spawn(move || {
        fio(
            &path,
            &[
                "--iodepth=32",
                "--verify=crc32c",
                "--do_verify=1",
                "--name=handoff",
                "--rw=randwrite",
                "--bs=4k",
                "--size=32M",
                "--loops=2",
                "--numjobs=1",
            ],
        )
    });
    // fio writes 2 x 8192 blocks (seconds under TCG): the hand-off lands among them.
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let id = dev.detach().expect("detach");
    let detached = start.elapsed();
    let state = ublk_core::device_info(id).expect("info").state;
    let successor = bounded("recover", Duration::from_secs(60), {
        let (target, queue) = (Arc::clone(&target), cfg.queue.clone());
        move || Device::recover(id, "mem", target, &queue, Duration::from_secs(10))
    })
    .expect("recover");
    let info = successor.info().expect("info");
    println!(
        "hand-off: detach {:.0} ms (then {state}), recovered in {:.0} ms total, successor flags {:#x}",
        detached.as_secs_f64() * 1000.0,
        start.elapsed().as_secs_f64() * 1000.0,
        info.flags
    );
    assert_eq!(info.state, DeviceState::Live);
    assert_ne!(
        info.flags & libublk::sys::UBLK_F_BATCH_IO as u64,
        0,
        "the successor keeps BATCH_IO"
    );
    bounded(
        "fio across the hand-off",
        Duration::from_secs(600),
        move || load.join().expect("fio thread"),
    );
    println!(
        "result: kernel {} transport {t} batch_io on on {on}: hand-off (quiesce {quiesce}) under fio verify passed",
        kernel_release()
    );
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        successor.stop_and_delete()
    })
    .expect("stop");
    if let Some(pool) = pool {
        assert_eq!(pool.queues(), 0);
    }
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_zero_copy_handoff_by_quiesce_under_load() {
    handoff_under_load(Transport::ZeroCopy, false, true);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_user_copy_pool_handoff_by_stop_flags_under_load() {
    handoff_under_load(Transport::UserCopy, true, false);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_batch_zero_copy_pool_handoff_by_quiesce_under_load() {
    handoff_under_load(Transport::ZeroCopy, true, true);
}
