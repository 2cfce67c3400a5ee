//! Kernel tests: data through the mem target on both transports.
//!
//! Each row creates a 2-queue mem device (requests split into 16 KiB chunks, so a 128 KiB
//! request is eight chunks), checks the kernel granted the row's transport, and verifies
//! data with fio (crc32c) and with a generation-tagged pattern read back byte for byte.

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks, MIB};
use glidefs_testkit::fio::fio;
use glidefs_testkit::process::bounded;
use ublk_core::targets::{DeferPolicy, MemOptions};
use ublk_core::testing::devices::mem_device;
use ublk_core::Transport;

const SIZE: u64 = 64 * MIB;

fn opts(defer: DeferPolicy) -> MemOptions {
    MemOptions {
        chunk_bytes: 16 * 1024,
        defer,
    }
}

fn fio_verify(t: Transport) {
    let (dev, target) = mem_device(t, SIZE, 2, opts(DeferPolicy::Slow));
    let path = dev.bdev_path();
    // Three concurrent jobs on disjoint ranges, so requests land on both queues.
    fio(
        &path,
        &[
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--runtime=120",
            "--name=rand4k",
            "--rw=randwrite",
            "--bs=4k",
            "--offset=0",
            "--size=16M",
            "--name=seq128k",
            "--rw=write",
            "--bs=128k",
            "--offset=16M",
            "--size=32M",
            "--name=mixed",
            "--rw=randrw",
            "--bsrange=4k-64k",
            "--offset=48M",
            "--size=16M",
        ],
    );
    let stats = target.stats();
    println!(
        "{t}: reads={} writes={} deferred={}",
        stats.reads.load(std::sync::atomic::Ordering::Relaxed),
        stats.writes.load(std::sync::atomic::Ordering::Relaxed),
        stats.deferred.load(std::sync::atomic::Ordering::Relaxed)
    );
    bounded(
        "stop_and_delete",
        std::time::Duration::from_secs(60),
        move || dev.stop_and_delete(),
    )
    .expect("stop and delete");
}

fn pattern_roundtrip(t: Transport, defer: DeferPolicy) {
    let (dev, target) = mem_device(t, SIZE, 2, opts(defer));
    let f = open_direct(&dev.bdev_path());
    let blocks = 4096; // 16 MiB
                       // Generation 1 everywhere with mixed request sizes, read back with other sizes.
    write_blocks(&f, 1, 0, blocks / 2, 1);
    write_blocks(&f, 1, blocks / 2, blocks / 2, 64);
    verify_blocks(&f, 0, blocks, 32, |_| Some(1));
    // Generation 2 over every third 4 KiB block (stale data would show generation 1).
    for b in (0..blocks).step_by(3) {
        write_blocks(&f, 2, b, 1, 1);
    }
    f.sync_all().expect("fsync (FLUSH)");
    verify_blocks(&f, 0, blocks, 128, |b| {
        Some(if b.is_multiple_of(3) { 2 } else { 1 })
    });
    // Write-zeroes over 1 MiB in the middle reads back as zeroes, neighbours untouched.
    let (zf, zc) = (1024u64, 256u64);
    // SAFETY: fallocate on an fd we own; no memory arguments.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::FALLOC_FL_ZERO_RANGE,
            (zf * 4096) as i64,
            (zc * 4096) as i64,
        )
    };
    assert_eq!(
        rc,
        0,
        "fallocate(ZERO_RANGE) on the device: {}",
        std::io::Error::last_os_error()
    );
    verify_blocks(&f, zf - 8, zc + 16, 8, |b| {
        if (zf..zf + zc).contains(&b) {
            None
        } else {
            Some(if b.is_multiple_of(3) { 2 } else { 1 })
        }
    });
    drop(f);
    // The FLUSH (and with `All`, every request) went through the deferred path.
    let deferred = target
        .stats()
        .deferred
        .load(std::sync::atomic::Ordering::Relaxed);
    println!("{t} {defer:?}: {deferred} requests finished through the deferred path");
    assert!(deferred > 0, "no request used the deferred path");
    if defer == DeferPolicy::All {
        // Every committed READ and WRITE went through the worker thread.
        let stats = target.stats();
        let rw = stats.reads.load(std::sync::atomic::Ordering::Relaxed)
            + stats.writes.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            deferred >= rw,
            "{deferred} deferred < {rw} reads+writes under DeferPolicy::All"
        );
    }
    bounded(
        "stop_and_delete",
        std::time::Duration::from_secs(60),
        move || dev.stop_and_delete(),
    )
    .expect("stop and delete");
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_mem_fio_verify() {
    fio_verify(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_mem_fio_verify() {
    fio_verify(Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_pattern_roundtrip() {
    pattern_roundtrip(Transport::ZeroCopy, DeferPolicy::Slow);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_pattern_roundtrip() {
    pattern_roundtrip(Transport::UserCopy, DeferPolicy::Slow);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_pattern_roundtrip_all_deferred() {
    pattern_roundtrip(Transport::ZeroCopy, DeferPolicy::All);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_pattern_roundtrip_all_deferred() {
    pattern_roundtrip(Transport::UserCopy, DeferPolicy::All);
}
