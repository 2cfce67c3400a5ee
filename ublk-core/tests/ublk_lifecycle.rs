//! Kernel tests: device lifecycle — info/list, stop under load, create/delete churn,
//! hand-off and recovery, and the stop that refuses a device in use.

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks, AlignedBuf, MIB};
use glidefs_testkit::process::{bounded, open_fds};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use ublk_core::safe_stop::{probe_exclusive, stop_if_unused, SafeStop, SafeStopError};
use ublk_core::targets::{DeferPolicy, MemOptions};
use ublk_core::testing::devices::{mem_device, ublk_block_devices, StuckWrites};
use ublk_core::{Device, DeviceState, KernelFeatures, Transport};

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_info_list_and_delete_by_id() {
    let (dev, _t) = mem_device(Transport::ZeroCopy, 32 * MIB, 2, MemOptions::default());
    let id = dev.id();
    let info = ublk_core::device_info(id).expect("device_info");
    println!("info: {info:?}");
    assert_eq!(info.state, DeviceState::Live);
    assert_eq!((info.queues, info.depth), (2, 64));
    assert_eq!(info.capacity_bytes, 32 * MIB);
    assert_eq!(
        (info.logical_block_size, info.physical_block_size),
        (512, 4096)
    );
    assert_eq!(info.max_io_bytes, 512 * 1024);
    assert!(
        info.recoverable(),
        "device created without USER_RECOVERY: {:#x}",
        info.flags
    );
    let listed = ublk_core::list_devices();
    assert!(
        listed
            .iter()
            .any(|d| d.id == id && d.state == DeviceState::Live),
        "{listed:?}"
    );
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        dev.stop_and_delete()
    })
    .expect("stop");
    assert!(
        !ublk_core::list_device_ids().contains(&id),
        "device {id} still listed after delete"
    );
    assert!(
        ublk_core::device_info(id).is_err(),
        "device {id} still answers after delete"
    );
}

fn stop_with_io_in_flight(t: Transport, defer: DeferPolicy) {
    let opts = MemOptions {
        chunk_bytes: 16 * 1024,
        defer,
    };
    let (dev, _target) = mem_device(t, 64 * MIB, 2, opts);
    let path = dev.bdev_path();
    let stop = Arc::new(AtomicBool::new(false));
    let done_ios = Arc::new(AtomicU64::new(0));
    // Four writers/readers hammering the device with O_DIRECT until it disappears.
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (path, stop, done_ios) = (path.clone(), Arc::clone(&stop), Arc::clone(&done_ios));
            std::thread::spawn(move || {
                let f = open_direct(&path);
                let mut buf = AlignedBuf::new(64 * 1024);
                let mut i = 0u64;
                let mut errors = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let off = ((w * 4096 + i * 7) % 1000) * 64 * 1024;
                    let r = if i.is_multiple_of(2) {
                        std::os::unix::fs::FileExt::write_at(&f, buf.as_slice(), off)
                    } else {
                        std::os::unix::fs::FileExt::read_at(&f, buf.as_mut_slice(), off)
                    };
                    match r {
                        Ok(_) => {
                            done_ios.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors += 1;
                            if errors > 3 {
                                break; // the device is gone
                            }
                        }
                    }
                    i += 1;
                }
                errors
            })
        })
        .collect();
    while done_ios.load(Ordering::Relaxed) < 200 {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "{t}: {} I/Os done, stopping with I/O in flight",
        done_ios.load(Ordering::Relaxed)
    );
    bounded(
        "stop_and_delete under load",
        Duration::from_secs(60),
        move || dev.stop_and_delete(),
    )
    .expect("stop under load");
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let errors = bounded("worker exit", Duration::from_secs(30), move || {
            w.join().expect("worker")
        });
        println!("worker saw {errors} errors after the stop");
    }
    assert!(
        !std::path::Path::new(&path).exists() && ublk_block_devices().is_empty(),
        "{path} left behind: {:?}",
        ublk_block_devices()
    );
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_stop_with_io_in_flight() {
    stop_with_io_in_flight(Transport::ZeroCopy, DeferPolicy::Never);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_stop_with_io_in_flight_deferred() {
    stop_with_io_in_flight(Transport::UserCopy, DeferPolicy::All);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_create_delete_20_times_leaks_nothing() {
    let cycle = |i: u64| {
        let t = if i.is_multiple_of(2) {
            Transport::ZeroCopy
        } else {
            Transport::UserCopy
        };
        let (dev, _target) = mem_device(t, 8 * MIB, 2, MemOptions::default());
        let f = open_direct(&dev.bdev_path());
        write_blocks(&f, i + 1, i, 4, 4);
        verify_blocks(&f, i, 4, 4, |_| Some(i + 1));
        drop(f);
        dev.stop_and_delete().expect("stop and delete");
    };
    // One warm-up cycle: libublk keeps a per-thread control ring open after first use.
    cycle(0);
    let fds_before = open_fds();
    let devs_before = ublk_block_devices();
    let ids_before = ublk_core::list_device_ids();
    for i in 1..=20 {
        cycle(i);
    }
    let (fds_after, devs_after, ids_after) = (
        open_fds(),
        ublk_block_devices(),
        ublk_core::list_device_ids(),
    );
    println!("fds {fds_before} -> {fds_after}, block devices {devs_before:?} -> {devs_after:?}, ids {ids_before:?} -> {ids_after:?}");
    assert_eq!(
        fds_after, fds_before,
        "fd leak over 20 create/delete cycles"
    );
    assert_eq!(devs_after, devs_before, "block devices left behind");
    assert_eq!(ids_after, ids_before, "ublk devices left behind");
}

fn handoff_and_recover(t: Transport) {
    let size = 16 * MIB;
    let (dev, target) = mem_device(
        t,
        size,
        2,
        MemOptions {
            chunk_bytes: 16 * 1024,
            defer: DeferPolicy::Never,
        },
    );
    let path = dev.bdev_path();
    let f = open_direct(&path);
    write_blocks(&f, 7, 0, 1024, 16);
    let id = dev.detach().expect("detach");
    // The block device stays; the kernel quiesces it until a new server arrives.
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} vanished on detach"
    );
    let successor = bounded("recover", Duration::from_secs(60), {
        let target = Arc::clone(&target);
        move || {
            Device::recover(
                id,
                "mem",
                target,
                &Default::default(),
                Duration::from_secs(10),
            )
        }
    })
    .expect("recover");
    assert_eq!(successor.transport(), t);
    let info = successor.info().expect("info");
    println!(
        "recovered {}: state {} transport {}",
        successor.bdev_path(),
        info.state,
        successor.transport()
    );
    assert_eq!(info.state, DeviceState::Live);
    // The same open file keeps working: the filesystem above would not notice.
    verify_blocks(&f, 0, 1024, 64, |_| Some(7));
    write_blocks(&f, 8, 0, 16, 16);
    verify_blocks(&f, 0, 32, 32, |b| Some(if b < 16 { 8 } else { 7 }));
    drop(f);
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        successor.stop_and_delete()
    })
    .expect("stop");
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_handoff_and_recover() {
    handoff_and_recover(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_handoff_and_recover() {
    handoff_and_recover(Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_stop_with_a_stuck_deferred_request_is_bounded() {
    let target = StuckWrites::new(8 * MIB);
    let mut cfg = ublk_core::DeviceConfig::new("stuck", 8 * MIB);
    cfg.queues = 2;
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create");
    let path = dev.bdev_path();
    println!("{path}: transport {}", dev.transport());
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            let f = open_direct(&path);
            let buf = AlignedBuf::new(4096);
            std::os::unix::fs::FileExt::write_at(&f, buf.as_slice(), 0).map(|_| ())
        })
    };
    target.wait_for_a_held_write();
    println!("a WRITE is held by the target; stopping");
    let res = bounded(
        "stop_and_delete with a held request",
        Duration::from_secs(60),
        move || dev.stop_and_delete(),
    );
    println!("stop returned: {res:?}");
    let write = bounded("stuck writer", Duration::from_secs(30), move || {
        writer.join().expect("writer")
    });
    println!("the held write ended with {write:?}");
    assert!(
        write.is_err(),
        "a write the target never finished must not succeed"
    );
    assert!(!std::path::Path::new(&path).exists(), "{path} left behind");
    assert!(
        ublk_core::list_device_ids().is_empty(),
        "devices left: {:?}",
        ublk_core::list_device_ids()
    );
    // Finishing the stale tokens now is harmless (the queues are gone).
    target.release(4096);
}

/// `stop_if_unused` refuses a device something has open and leaves it serving; stops it once
/// nothing does. An exclusive holder (what a mount is to the block layer) is refused by both
/// TRY_STOP_DEV and the `O_EXCL` fallback; a plain opener only by TRY_STOP_DEV (SAFE_STOP_DEV,
/// which this test needs: the VM kernel is 7.0+). Data written before the refusals reads back.
fn safe_stop(t: Transport) {
    let features = KernelFeatures::probe().expect("features");
    assert!(
        features.safe_stop(),
        "kernel {} lacks SAFE_STOP_DEV ({features}); the VM kernel has it",
        ublk_core::features::kernel_release()
    );
    let (dev, _target) = mem_device(t, 32 * MIB, 1, MemOptions::default());
    let (id, path) = (dev.id(), dev.bdev_path());
    let busy = |r: Result<SafeStop, SafeStopError>, what: &str| match r {
        Err(SafeStopError::Busy { how, .. }) => println!("{t}: {what}: busy ({how})"),
        other => panic!("{t}: {what}: {other:?}, expected busy"),
    };
    {
        let f = open_direct(&path);
        write_blocks(&f, 7, 0, 256, 64);
        f.sync_all().expect("fsync");
    }
    let exclusive = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&path)
        .expect("O_EXCL open");
    busy(
        probe_exclusive(&path).map(|()| SafeStop::Probed),
        "O_EXCL holder, fallback probe",
    );
    busy(stop_if_unused(id), "O_EXCL holder, TRY_STOP_DEV");
    drop(exclusive);
    let plain = std::fs::File::open(&path).expect("plain open");
    probe_exclusive(&path).expect("the fallback does not see a plain opener");
    busy(stop_if_unused(id), "plain opener, TRY_STOP_DEV");
    verify_blocks(&open_direct(&path), 0, 256, 64, |_| Some(7));
    drop(plain);
    assert_eq!(
        ublk_core::device_info(id).expect("info").state,
        DeviceState::Live,
        "a refused stop stopped the device"
    );
    let r = stop_if_unused(id).expect("stop an unused device");
    assert_eq!(r, SafeStop::Stopped);
    assert_eq!(
        ublk_core::device_info(id).expect("info").state,
        DeviceState::Dead
    );
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        dev.stop_and_delete()
    })
    .expect("delete after TRY_STOP_DEV");
    assert!(!ublk_core::list_device_ids().contains(&id));
    println!("{t}: unused device {path} stopped by TRY_STOP_DEV and deleted");
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_safe_stop_refuses_a_device_in_use() {
    safe_stop(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_safe_stop_refuses_a_device_in_use() {
    safe_stop(Transport::UserCopy);
}
