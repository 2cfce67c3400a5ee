//! Kernel tests of the volume target: a glidefs volume (temp cache dir + in-memory object
//! store, 64 KiB blocks) served as a ublk device on both transports.
//!
//! One flow per transport: O_DIRECT writes of generation-tagged 4 KiB pages (full blocks and
//! partial ones), syncs to the store and eviction so later writes need fetches (deferred
//! slow path) and reads go cold (scratch memfd), a FLUSH (fsync), a FUA write (RWF_DSYNC),
//! WRITE_ZEROES and DISCARD; everything read back. Then the device is stopped, the volume
//! synced and closed, reopened in a new, empty cache directory on the same store and served
//! by a new device: everything reads back again (all cold). Finally fio `--verify=crc32c`
//! (when fio exists) while the volume syncs to the store in the background.
//!
//! Then, per transport, reads of never-written blocks with busy threads on every CPU
//! (`zeros_under_cpu_pressure`).
//!
//! Needs /dev/ublk-control: `scripts/test` runs it under `scripts/ublk-vm`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs::ublk::volume_target::device::{VolumeDevice, VolumeDeviceOptions};
use glidefs_testkit::blockdev::{fill_block, open_direct, verify_blocks, write_blocks, AlignedBuf};
use glidefs_volume::{Volume, VolumeConfig};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use ublk_core::{IoOp, Transport};

const SIZE: u64 = 16 << 20;
const BLOCK: u32 = 64 << 10;
/// 4 KiB pages of the volume.
const PAGES: u64 = SIZE / 4096;
/// 4 KiB pages per cache block.
const PER_BLOCK: u64 = BLOCK as u64 / 4096;
/// A block only gens 1 and 2 write (pages below `PAGES * 3 / 4`, above gen 3's range and
/// gen 4's pages); evicted before the read-back.
const COLD_BLOCK: u64 = 150;
const BLKDISCARD: libc::c_ulong = 0x1277;
/// A fio run taking longer than this under emulation is a hang.
const FIO_LIMIT: Duration = Duration::from_secs(300);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn open_volume(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    store: Arc<dyn ObjectStore>,
) -> Arc<Volume> {
    let mut cfg = VolumeConfig::new("vol", dir, SIZE);
    cfg.block_size = BLOCK;
    cfg.pack_bytes = 1 << 20;
    cfg.readahead_blocks = 2;
    rt.block_on(Volume::open(cfg, store)).expect("open volume")
}

fn create_device(rt: &tokio::runtime::Runtime, volume: &Arc<Volume>, t: Transport) -> VolumeDevice {
    let opts = VolumeDeviceOptions {
        queues: 2,
        depth: 32,
        max_io_bytes: 256 << 10,
        read_only: false,
        transport: ublk_core::testing::devices::preference(t),
        ..VolumeDeviceOptions::default()
    };
    let dev = VolumeDevice::create(Arc::clone(volume), rt.handle().clone(), &opts)
        .expect("create volume device");
    println!(
        "device {} (id {}) kernel {}: asked {t}, granted {}",
        dev.bdev_path(),
        dev.id(),
        ublk_core::features::kernel_release(),
        dev.transport()
    );
    assert_eq!(
        dev.transport(),
        t,
        "kernel granted {} instead of {t}",
        dev.transport()
    );
    dev
}

/// Writes generation `gen` of page `page` with RWF_DSYNC (a FUA write on the device).
fn fua_write_page(f: &File, gen: u64, page: u64) {
    let mut buf = AlignedBuf::new(4096);
    fill_block(&mut buf.as_mut_slice()[..4096], gen, page);
    let iov = libc::iovec {
        iov_base: buf.as_mut_slice().as_mut_ptr().cast(),
        iov_len: 4096,
    };
    let off = libc::off_t::try_from(page * 4096).expect("offset");
    // SAFETY: one iovec over a live, 4096-byte aligned buffer; the fd is open.
    let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, off, libc::RWF_DSYNC) };
    assert_eq!(
        n,
        4096,
        "pwritev2 RWF_DSYNC: {}",
        std::io::Error::last_os_error()
    );
}

/// DISCARD of `len` bytes at `off` (BLKDISCARD).
fn discard(f: &File, off: u64, len: u64) {
    let range = [off, len];
    // SAFETY: BLKDISCARD reads two u64 from a live local array.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
    assert_eq!(rc, 0, "BLKDISCARD: {}", std::io::Error::last_os_error());
}

/// WRITE_ZEROES of `len` bytes at `off` (fallocate PUNCH_HOLE on a block device).
fn write_zeroes(f: &File, off: u64, len: u64) {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open fd, no memory arguments.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
    assert_eq!(
        rc,
        0,
        "fallocate PUNCH_HOLE: {}",
        std::io::Error::last_os_error()
    );
}

/// Writes generation `gen` over pages `[first, first+count)` and records it in `model`.
fn write_gen(f: &File, model: &mut [Option<u64>], gen: u64, first: u64, count: u64, io_pages: u64) {
    write_blocks(f, gen, first, count, io_pages);
    for p in first..first + count {
        model[p as usize] = Some(gen);
    }
}

fn verify_all(f: &File, model: &[Option<u64>], io_pages: u64) {
    verify_blocks(f, 0, PAGES, io_pages, |p| model[p as usize]);
}

fn print_stats(what: &str, dev: &VolumeDevice) -> glidefs::ublk::volume_target::IoStats {
    let s = dev.stats();
    for (op, o) in glidefs::ublk::volume_target::IO_OPS.iter().zip(&s.ops) {
        println!(
            "{what}: {op:?}: count={} bytes={} errors={} latency_sum_us={}",
            o.count, o.bytes, o.errors, o.latency_sum_us
        );
    }
    println!(
        "{what}: inline={} deferred={} cold_reads={} cold_read_bytes={} scratch_bytes={} fua_writes={}",
        s.inline, s.deferred, s.cold_reads, s.cold_read_bytes, s.scratch_bytes, s.fua_writes
    );
    for op in glidefs::ublk::volume_target::IO_OPS {
        assert_eq!(s.op(op).errors, 0, "{what}: {op:?} errors");
    }
    s
}

fn volume_flow(t: Transport) {
    let rt = runtime();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir1 = tempfile::tempdir().expect("tempdir");
    let vol = open_volume(&rt, dir1.path(), Arc::clone(&store));
    let dev = create_device(&rt, &vol, t);
    let f = open_direct(&dev.bdev_path());
    let mut model: Vec<Option<u64>> = vec![None; PAGES as usize];

    // gen 1: the first half in 64 KiB requests (whole blocks: inline writes).
    write_gen(&f, &mut model, 1, 0, PAGES / 2, PER_BLOCK);
    rt.block_on(vol.sync_to_store()).expect("sync 1");
    // gen 2: single pages over Clean blocks (promotion before write), some new blocks.
    for p in (0..PAGES * 3 / 4).step_by(7) {
        write_gen(&f, &mut model, 2, p, 1, 1);
    }
    rt.block_on(vol.sync_to_store()).expect("sync 2");
    let evicted = rt.block_on(vol.evict_to(0)).expect("evict");
    println!("evicted {evicted} blocks");
    // gen 3: partial writes to evicted blocks: NeedsFetch, the deferred slow path.
    for p in (3..PAGES / 2).step_by(37) {
        write_gen(&f, &mut model, 3, p, 2, 2);
    }
    f.sync_all().expect("fsync (FLUSH)");
    // gen 4: FUA writes.
    for p in [5, PAGES / 2 + 9, PAGES - 1] {
        fua_write_page(&f, 4, p);
        model[p as usize] = Some(4);
    }
    // WRITE_ZEROES over part of an evicted block and a dirty one; DISCARD over a whole
    // evicted block and a never-written range.
    write_zeroes(&f, 20 * 4096, 24 * 4096);
    model[20..44].fill(None);
    let blk = 40 * u64::from(BLOCK);
    discard(&f, blk, u64::from(BLOCK));
    for p in blk / 4096..(blk + u64::from(BLOCK)) / 4096 {
        model[p as usize] = None;
    }
    discard(&f, SIZE - 4 * u64::from(BLOCK), 2 * u64::from(BLOCK));
    for p in (SIZE - 4 * u64::from(BLOCK)) / 4096..(SIZE - 2 * u64::from(BLOCK)) / 4096 {
        model[p as usize] = None;
    }
    // Read everything back in 2 sizes: cold blocks are fetched (by the read or readahead).
    rt.block_on(vol.evict_to(0)).expect("evict 2");
    // One lone read of a block that only gens 1 and 2 wrote (evicted since): no stream runs
    // yet, so no readahead can have fetched it first and it must be a cold read. (In the
    // sequential passes below readahead may win the race for any block: on a loaded host
    // every read could find its blocks already local.)
    let cold_block = COLD_BLOCK * PER_BLOCK;
    let cold_before = dev.stats().cold_reads;
    verify_blocks(&f, cold_block, PER_BLOCK, PER_BLOCK, |p| model[p as usize]);
    let cold_after = dev.stats().cold_reads;
    assert_eq!(
        cold_after,
        cold_before + 1,
        "a lone read of evicted block {COLD_BLOCK} was not one cold read"
    );
    verify_all(&f, &model, 32);
    verify_all(&f, &model, 3);
    let s = print_stats("first device", &dev);
    assert!(s.inline > 0, "no inline requests");
    assert!(s.deferred > 0, "no deferred requests");
    assert!(
        s.fua_writes >= 3,
        "FUA writes not made durable: {}",
        s.fua_writes
    );
    assert!(s.op(IoOp::Flush).count >= 1, "no FLUSH reached the target");
    assert!(s.op(IoOp::WriteZeroes).count + s.op(IoOp::Discard).count >= 2);
    drop(f);
    dev.stop().expect("stop device");
    rt.block_on(vol.sync_to_store()).expect("sync 3");
    rt.block_on(vol.close()).expect("close");
    drop(vol);

    // A new host: empty cache directory, same store.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let vol = open_volume(&rt, dir2.path(), Arc::clone(&store));
    let dev = create_device(&rt, &vol, t);
    let f = open_direct(&dev.bdev_path());
    verify_all(&f, &model, 16);
    // Again while eviction runs in a loop: fetched blocks get evicted before the re-plan
    // (served from the scratch memfd) and the gate's write side contends with the I/O.
    let stop = Arc::new(AtomicBool::new(false));
    let evicter = {
        let (vol, stop, handle) = (Arc::clone(&vol), Arc::clone(&stop), rt.handle().clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                n += handle.block_on(vol.evict_to(0)).expect("background evict");
            }
            n
        })
    };
    for io_pages in [64, 5] {
        verify_all(&f, &model, io_pages);
    }
    stop.store(true, Ordering::Release);
    let evicted = evicter.join().expect("evicter thread");
    println!("{evicted} blocks evicted while reading");
    let s = print_stats("cold device", &dev);
    assert!(s.cold_reads > 0, "the reopened volume read nothing cold");

    if which_fio() {
        let stop = Arc::new(AtomicBool::new(false));
        let syncer = {
            let (vol, stop, handle) = (Arc::clone(&vol), Arc::clone(&stop), rt.handle().clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    handle
                        .block_on(vol.sync_to_store())
                        .expect("background sync");
                    n += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                n
            })
        };
        fio_job(
            &dev,
            "randwrite",
            &["--rw=randwrite", "--bs=4k", "--size=4M", "--iodepth=16"],
        );
        fio_job(
            &dev,
            "seq",
            &[
                "--rw=write",
                "--bs=128k",
                "--offset=4M",
                "--size=4M",
                "--iodepth=4",
            ],
        );
        fio_job(
            &dev,
            "randrw",
            &[
                "--rw=randrw",
                "--bs=16k",
                "--offset=2M",
                "--size=8M",
                "--iodepth=8",
            ],
        );
        stop.store(true, Ordering::Release);
        let syncs = syncer.join().expect("syncer thread");
        println!("fio passed with {syncs} syncs to the store during the run");
        print_stats("after fio", &dev);
    } else {
        println!("fio not found: fio verification skipped");
    }
    drop(f);
    dev.stop().expect("stop device 2");
    rt.block_on(vol.close()).expect("close 2");
}

/// One fio job with crc32c verification, bounded by [`FIO_LIMIT`].
fn fio_job(dev: &VolumeDevice, name: &str, args: &[&str]) {
    let path = dev.bdev_path();
    let mut all: Vec<String> = vec![
        format!("--name={name}"),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    glidefs_testkit::process::bounded(&format!("fio {name}"), FIO_LIMIT, move || {
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        glidefs_testkit::fio::fio(&path, &refs);
    });
}

fn which_fio() -> bool {
    std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// How long `zeros_under_cpu_pressure` reads.
const PRESSURE_FOR: Duration = Duration::from_secs(10);

/// READs of never-written blocks (zero-copy serves them from `/dev/zero`, whose reads stop
/// early when the reader should reschedule) while busy threads keep every CPU wanted: every
/// 1 MiB O_DIRECT read (four readers) must succeed and read zeros. The queue now submits
/// the rest of a short zeros chunk; this test did not make one happen in the TCG VM (0
/// failures without that change too: its kernel's lazy preemption lets a `/dev/zero` read
/// stop early only when it outlasts a tick, see
/// docs/decisions/0009-complete-short-reads-of-zeros.md), so it guards the path rather than
/// reproducing the power-loss campaign's daemon-point EIO.
fn zeros_under_cpu_pressure(t: Transport) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = open_volume(&rt, dir.path(), Arc::new(InMemory::new()));
    let dev = create_device(&rt, &vol, t);
    let f = open_direct(&dev.bdev_path());
    let stop = Arc::new(AtomicBool::new(false));
    let busy = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..busy)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
        })
        .collect();
    // Four readers of 1 MiB (four requests each) keep the queue busy per wake-up.
    let io = 1u64 << 20;
    let readers: Vec<_> = (0..4u64)
        .map(|r| {
            let f = f.try_clone().expect("dup the device fd");
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(io as usize);
                let (mut reads, mut failed) = (0u64, Vec::new());
                let mut off = r * io;
                let until = Instant::now() + PRESSURE_FOR;
                while Instant::now() < until {
                    buf.as_mut_slice().fill(0xA5);
                    match f.read_exact_at(buf.as_mut_slice(), off) {
                        Ok(()) => assert!(
                            buf.as_slice().iter().all(|&b| b == 0),
                            "{t}: a read of never-written blocks at {off} returned non-zero bytes"
                        ),
                        Err(e) => failed.push(format!("{off}: {e}")),
                    }
                    reads += 1;
                    off = (off + 4 * io) % SIZE;
                }
                (reads, failed)
            })
        })
        .collect();
    let (mut reads, mut failed) = (0u64, Vec::new());
    for h in readers {
        let (n, errs) = h.join().expect("reader thread");
        reads += n;
        failed.extend(errs);
    }
    stop.store(true, Ordering::Release);
    for h in hogs {
        h.join().expect("busy thread");
    }
    println!(
        "{t}: {reads} reads of 1 MiB of never-written blocks (4 readers) beside {busy} busy threads: {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{t}: {} of {reads} reads failed, first: {:?}",
        failed.len(),
        failed.first()
    );
    drop(f);
    dev.stop().expect("stop device");
    rt.block_on(vol.close()).expect("close");
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn volume_device_zeros_under_cpu_pressure_zero_copy() {
    zeros_under_cpu_pressure(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn volume_device_zeros_under_cpu_pressure_user_copy() {
    zeros_under_cpu_pressure(Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn volume_device_zero_copy() {
    volume_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn volume_device_user_copy() {
    volume_flow(Transport::UserCopy);
}
