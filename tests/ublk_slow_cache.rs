//! Kernel test: hot reads do not follow a slow cache disk (issue 22, item 3).
//!
//! The daemon's data dir is ext4 on `dm-delay` over a ram disk, and the volume has one queue,
//! so every request goes through the same loop thread. A hot region (blocks already in the
//! cache and in the page cache) is read in a loop while another thread writes 4 KiB into
//! Clean blocks whose cache pages are cold: each such write must first copy its block's old
//! bytes into the active file (a promote), a read of the slow disk. Reads of the disk are
//! delayed by [`DELAY_MS`] while the two run.
//!
//! Before, the promote ran on the loop thread, so every hot read queued behind it waited up
//! to the disk's delay. Now the loop thread defers any write that needs file I/O, so hot
//! reads stay as fast as the page cache. The test checks that the slow writes did meet the
//! slow disk (the slowest write took at least [`DELAY_MS`]: the fault was really there), that
//! no hot read took half as long, and that every byte reads back. Latencies are printed as
//! JSON.
//!
//! Needs /dev/ublk-control, the brd and dm-delay modules, dmsetup and mkfs.ext4:
//! `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use support::daemon;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use daemon::{device_of, run, sh, Daemon, Mount, Store};
use glidefs_testkit::blockdev::{fill_block, open_direct, write_blocks, AlignedBuf};
use ublk_core::Transport;

/// dm-delay's read delay while the hot reads and slow writes run.
const DELAY_MS: u64 = 1000;
/// The ram disk under the cache filesystem (KiB).
const RAM_KIB: u64 = 256 << 10;
/// The device-mapper target.
const DM: &str = "glidefs-slow-cache";
/// 4 KiB pages per 64 KiB volume block.
const PAGES_PER_BLOCK: u64 = 16;
/// Hot blocks: 0..HOT.
const HOT: u64 = 16;
/// Clean, cold blocks written into: HOT..HOT + COLD.
const COLD: u64 = 256;
/// How long the hot reads and slow writes run.
const RUN: Duration = Duration::from_secs(12);

/// The dm-delay table over `/dev/ram0`: reads delayed by `read_ms`, writes not.
fn table(read_ms: u64) -> String {
    let sectors = RAM_KIB * 2;
    format!("0 {sectors} delay /dev/ram0 0 {read_ms} /dev/ram0 0 0")
}

/// A ram disk under dm-delay (no delay yet), with ext4 on it; removed on drop.
struct SlowDisk;

impl SlowDisk {
    fn new() -> SlowDisk {
        let _ = sh(&format!(
            "dmsetup remove {DM} 2>/dev/null; rmmod brd 2>/dev/null"
        ));
        run(
            "modprobe",
            &["brd", "rd_nr=1", &format!("rd_size={RAM_KIB}")],
        );
        run("modprobe", &["dm-delay"]);
        run(
            "dmsetup",
            &["create", DM, "--noudevsync", "--table", &table(0)],
        );
        run("dmsetup", &["mknodes", DM]);
        run("mkfs.ext4", &["-q", "-F", &Self::path()]);
        SlowDisk
    }

    fn path() -> String {
        format!("/dev/mapper/{DM}")
    }

    /// Reloads the table with reads delayed by `read_ms`.
    fn set_read_delay(&self, read_ms: u64) {
        run(
            "dmsetup",
            &["reload", DM, "--noudevsync", "--table", &table(read_ms)],
        );
        run("dmsetup", &["resume", DM, "--noudevsync"]);
        println!("cache disk: reads delayed by {read_ms} ms");
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let _ = sh(&format!(
            "dmsetup remove {DM} 2>/dev/null; rmmod brd 2>/dev/null"
        ));
    }
}

/// Median, 99th percentile and maximum, in milliseconds.
fn summary(mut lat: Vec<Duration>) -> serde_json::Value {
    lat.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    serde_json::json!({
        "count": lat.len(),
        "median_ms": ms(at(0.5)),
        "p99_ms": ms(at(0.99)),
        "max_ms": ms(*lat.last().expect("latencies")),
    })
}

fn hot_reads_beside_slow_writes(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let work = work.path();
    let disk = SlowDisk::new();
    let cachefs = work.join("cachefs");
    let mount = Mount::new(&SlowDisk::path(), &cachefs);
    println!("=== hot reads beside writes that promote from a slow cache disk, {t}");
    let store = Store::local(work);
    let dwork = work.join("daemon");
    let config = daemon::one_queue_config(&cachefs.join("data"), &dwork, &store);
    let d = Daemon::start_with_config(&dwork, &config, &store, t);
    let dev = device_of(&d.json(&["create", "slow", "--size", "64M"]), t);
    let f = open_direct(&dev);
    // Generation 1 everywhere it is used, in 64 KiB writes (whole blocks: no promote).
    write_blocks(&f, 1, 0, (HOT + COLD) * PAGES_PER_BLOCK, 16);
    d.json(&["flush", "slow"]);
    // Every block is Clean now; cold pages come from the disk from here on.
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache");
    let mut page = AlignedBuf::new(4096);
    for p in 0..HOT * PAGES_PER_BLOCK {
        f.read_exact_at(page.as_mut_slice(), p * 4096)
            .expect("warm the hot region");
    }
    disk.set_read_delay(DELAY_MS);

    let stop = AtomicBool::new(false);
    let (reads, writes) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let f = open_direct(&dev);
            let mut buf = AlignedBuf::new(4096);
            let mut want = vec![0u8; 4096];
            let mut lat = Vec::new();
            let mut p = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                f.read_exact_at(buf.as_mut_slice(), p * 4096)
                    .unwrap_or_else(|e| panic!("hot read of page {p}: {e}"));
                lat.push(t0.elapsed());
                fill_block(&mut want, 1, p);
                assert!(
                    buf.as_slice() == want.as_slice(),
                    "hot page {p} reads back wrong"
                );
                p = (p + 7) % (HOT * PAGES_PER_BLOCK);
            }
            lat
        });
        let writer = s.spawn(|| {
            let f = open_direct(&dev);
            let mut buf = AlignedBuf::new(4096);
            let mut lat = Vec::new();
            let start = Instant::now();
            // Blocks in a scattered order (defeats the cache file's readahead), one 4 KiB
            // page each: page 3 of the block.
            let mut b = 0u64;
            while start.elapsed() < RUN {
                b = (b + 37) % COLD;
                let page = (HOT + b) * PAGES_PER_BLOCK + 3;
                fill_block(buf.as_mut_slice(), 2, page);
                let t0 = Instant::now();
                f.write_all_at(buf.as_slice(), page * 4096)
                    .unwrap_or_else(|e| panic!("write of page {page}: {e}"));
                lat.push((t0.elapsed(), page));
            }
            stop.store(true, Ordering::Relaxed);
            lat
        });
        (
            reader.join().expect("reader"),
            writer.join().expect("writer"),
        )
    });
    disk.set_read_delay(0);

    let written: Vec<u64> = writes.iter().map(|(_, p)| *p).collect();
    let write_lat: Vec<Duration> = writes.iter().map(|(l, _)| *l).collect();
    let slowest_write = write_lat.iter().max().copied().unwrap_or_default();
    let slowest_read = reads.iter().max().copied().unwrap_or_default();
    let report = serde_json::json!({
        "kernel": ublk_core::features::kernel_release(),
        "transport": t.name(),
        "read_delay_ms": DELAY_MS,
        "hot_reads": summary(reads),
        "promoting_writes": summary(write_lat),
    });
    println!("{report}");
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kernel-test-results/ublk_slow_cache");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(format!("{}.json", t.name())), report.to_string());
    }

    // Everything reads back: generation 1, but 2 in the pages written.
    let mut buf = AlignedBuf::new(4096);
    let mut want = vec![0u8; 4096];
    for p in 0..(HOT + COLD) * PAGES_PER_BLOCK {
        f.read_exact_at(buf.as_mut_slice(), p * 4096)
            .unwrap_or_else(|e| panic!("read back page {p}: {e}"));
        fill_block(&mut want, if written.contains(&p) { 2 } else { 1 }, p);
        assert!(
            buf.as_slice() == want.as_slice(),
            "page {p} reads back wrong"
        );
    }
    println!(
        "all {} pages read back as written",
        (HOT + COLD) * PAGES_PER_BLOCK
    );
    drop(f);
    d.json(&["rm", "slow", "--purge"]);
    d.stop();
    mount.unmount();
    drop(disk);

    assert!(
        slowest_write >= Duration::from_millis(DELAY_MS),
        "no write met the slow disk (slowest {slowest_write:?}): the test did not test anything"
    );
    assert!(
        slowest_read < Duration::from_millis(DELAY_MS / 2),
        "a hot read took {slowest_read:?}: it waited for the slow disk ({DELAY_MS} ms reads) \
         behind a write's promote on the same queue"
    );
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn slow_cache_disk_hot_reads_zero_copy() {
    hot_reads_beside_slow_writes(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn slow_cache_disk_hot_reads_user_copy() {
    hot_reads_beside_slow_writes(Transport::UserCopy);
}
