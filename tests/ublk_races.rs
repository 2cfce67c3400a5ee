//! Kernel reproducer tests for the races a cache-backed block device is known to hit under
//! load, each on both transports (zero-copy and forced USER_COPY).
//!
//! Every test serves a glidefs volume (temp cache dir, in-memory object store, 64 KiB blocks:
//! sixteen 4 KiB pages per block) as a ublk device in this process, drives it with O_DIRECT
//! I/O of generation-tagged 4 KiB pages from several threads, and keeps a model of the last
//! completed write of every page. A "churn" thread meanwhile runs `Volume::sync_to_store`
//! back to back (rotation, upload, flush completion: the rotation gate's write side is taken
//! several times per sync) and, where the test says so, `evict_to(0)` (every Clean block
//! leaves the cache, so the next access is cold). A page that reads back anything but its
//! model's generation fails the test with the page, the generation found and the one expected.
//!
//! The interleavings, one test each (doc comments say more):
//! - `rotation_race_under_load`: many writers, rotations near-continuous;
//! - `write_vs_flush_of_the_same_block`: writes into the few blocks being flushed
//!   (promote-before-write);
//! - `read_after_write_during_rotations`: a hot read right after a rotation (never zeros);
//! - `read_and_write_of_an_evicted_block`: cold fill vs a concurrent write, many rounds;
//! - `flush_vs_rotation_does_not_deadlock`: FLUSH (fdatasync) interleaved with writes while
//!   rotations are forced; a watchdog fails the test after 30 s without progress and ends the
//!   process instead of hanging the test runner.
//!
//! Needs /dev/ublk-control: `scripts/test` runs it under `scripts/ublk-vm`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use glidefs::ublk::volume_target::device::{VolumeDevice, VolumeDeviceOptions};
use glidefs_testkit::blockdev::{fill_block, header, open_direct, AlignedBuf, Header};
use glidefs_volume::{Volume, VolumeConfig};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use ublk_core::{IoOp, Transport};

const BLOCK: u32 = 64 << 10;
/// 4 KiB pages per cache block.
const PER_BLOCK: u64 = BLOCK as u64 / 4096;
/// Fewest back-to-back syncs a load phase must overlap (each sync rotates, uploads and
/// completes: at least three write-side holds of the gate).
const MIN_SYNCS: u64 = 5;
/// No progress for this long is a deadlock.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A volume served as a ublk device by this process.
struct Rig {
    rt: tokio::runtime::Runtime,
    vol: Arc<Volume>,
    dev: Option<VolumeDevice>,
    path: String,
    transport: Transport,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new(t: Transport, size: u64) -> Rig {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = VolumeConfig::new("races", dir.path(), size);
        cfg.block_size = BLOCK;
        cfg.pack_bytes = 256 << 10;
        cfg.readahead_blocks = 0;
        let vol = rt.block_on(Volume::open(cfg, store)).expect("open volume");
        let opts = VolumeDeviceOptions {
            queues: 2,
            depth: 32,
            max_io_bytes: 256 << 10,
            read_only: false,
            transport: ublk_core::testing::devices::preference(t),
            ..VolumeDeviceOptions::default()
        };
        let dev = VolumeDevice::create(Arc::clone(&vol), rt.handle().clone(), &opts)
            .expect("create volume device");
        println!(
            "device {} kernel {}: asked {t}, granted {}",
            dev.bdev_path(),
            ublk_core::features::kernel_release(),
            dev.transport()
        );
        assert_eq!(dev.transport(), t, "kernel granted another transport");
        let path = dev.bdev_path();
        Rig {
            rt,
            vol,
            dev: Some(dev),
            path,
            transport: t,
            _dir: dir,
        }
    }

    fn open(&self) -> File {
        open_direct(&self.path)
    }

    fn sync(&self) {
        self.rt
            .block_on(self.vol.sync_to_store())
            .expect("sync to store");
    }

    fn evict_all(&self) -> u64 {
        self.rt.block_on(self.vol.evict_to(0)).expect("evict")
    }

    /// Starts the churn thread: back-to-back syncs to the store, and `evict_to(0)` after
    /// each when `evict` is set.
    fn churn(&self, evict: bool) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let (vol, handle, flag) = (
            Arc::clone(&self.vol),
            self.rt.handle().clone(),
            Arc::clone(&stop),
        );
        let thread = std::thread::spawn(move || {
            let mut syncs = 0u64;
            while !flag.load(Ordering::Acquire) {
                handle
                    .block_on(vol.sync_to_store())
                    .expect("background sync");
                if evict {
                    handle.block_on(vol.evict_to(0)).expect("background evict");
                }
                syncs += 1;
            }
            syncs
        });
        Churn { stop, thread }
    }

    /// Prints the device's counters, fails on any I/O error, returns them.
    fn finish(mut self, what: &str) -> glidefs::ublk::volume_target::IoStats {
        let dev = self.dev.take().expect("device");
        let s = dev.stats();
        println!(
            "{what} [{}]: reads={} writes={} flushes={} inline={} deferred={} cold_reads={} rotations(gen)={}",
            self.transport,
            s.op(IoOp::Read).count,
            s.op(IoOp::Write).count,
            s.op(IoOp::Flush).count,
            s.inline,
            s.deferred,
            s.cold_reads,
            self.vol.manifest_generation(),
        );
        for op in glidefs::ublk::volume_target::IO_OPS {
            assert_eq!(s.op(op).errors, 0, "{what}: {op:?} errors");
        }
        dev.stop().expect("stop device");
        self.rt.block_on(self.vol.close()).expect("close volume");
        s
    }
}

/// The background sync (and evict) thread of a test.
struct Churn {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Churn {
    /// Stops the thread; returns how many syncs it ran.
    fn end(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("churn thread")
    }
}

/// xorshift64: a tiny deterministic generator per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Generations are unique across the whole test: one counter.
static GEN: AtomicU64 = AtomicU64::new(1);

fn next_gen() -> u64 {
    GEN.fetch_add(1, Ordering::Relaxed)
}

fn write_page(f: &File, buf: &mut AlignedBuf, page: u64, gen: u64) {
    fill_block(&mut buf.as_mut_slice()[..4096], gen, page);
    f.write_all_at(&buf.as_slice()[..4096], page * 4096)
        .unwrap_or_else(|e| panic!("write page {page} gen {gen}: {e}"));
}

/// What a 4 KiB page holds compared with `want` (a generation, `None` = never written).
fn describe(have: &[u8], page: u64, want: Option<u64>) -> Option<String> {
    let mut expected = vec![0u8; 4096];
    if let Some(g) = want {
        fill_block(&mut expected, g, page);
    }
    if have == expected.as_slice() {
        return None;
    }
    let found = match header(have) {
        _ if have.iter().all(|&b| b == 0) => "zeros".to_string(),
        Header {
            generation: g,
            block: Some(p),
        } => {
            let mut intact = vec![0u8; 4096];
            fill_block(&mut intact, g, p);
            let torn = if have == intact.as_slice() {
                ""
            } else {
                " (torn)"
            };
            format!("gen {g} of page {p}{torn}")
        }
        h => format!("unrecognised bytes (header {h:?})"),
    };
    Some(format!(
        "page {page} (block {}): expected {}, found {found}",
        page / PER_BLOCK,
        want.map_or("zeros".to_string(), |g| format!("gen {g}")),
    ))
}

/// Whether every byte of `have` (page `page`) is the same byte of the page at generation
/// `before` (`None` = never written) or at generation `after`.
fn mix_of(have: &[u8], page: u64, before: Option<u64>, after: u64) -> bool {
    let (mut old, mut new) = (vec![0u8; 4096], vec![0u8; 4096]);
    if let Some(g) = before {
        fill_block(&mut old, g, page);
    }
    fill_block(&mut new, after, page);
    have.iter()
        .zip(old.iter().zip(&new))
        .all(|(h, (o, n))| h == o || h == n)
}

/// Reads pages `[first, first+count)` and checks each against `model`; panics with `what`
/// and every mismatching page (at most 8 listed).
fn verify(f: &File, first: u64, count: u64, model: impl Fn(u64) -> Option<u64>, what: &str) {
    let io_pages = 16u64;
    let mut buf = AlignedBuf::new((io_pages * 4096) as usize);
    let mut bad = Vec::new();
    let mut p = first;
    while p < first + count {
        let n = io_pages.min(first + count - p);
        let got = &mut buf.as_mut_slice()[..(n * 4096) as usize];
        f.read_exact_at(got, p * 4096)
            .unwrap_or_else(|e| panic!("{what}: read pages {p}+{n}: {e}"));
        for i in 0..n {
            let s = (i * 4096) as usize;
            if let Some(d) = describe(&got[s..s + 4096], p + i, model(p + i)) {
                bad.push(d);
            }
        }
        p += n;
    }
    assert!(
        bad.is_empty(),
        "{what}: {} pages wrong, e.g.:\n  {}",
        bad.len(),
        bad.iter().take(8).cloned().collect::<Vec<_>>().join("\n  ")
    );
}

/// Merges the writers' models: page `p` is owned by writer `p % models.len()`.
fn merge(models: Vec<Vec<Option<u64>>>) -> Vec<Option<u64>> {
    let n = models.len();
    (0..models[0].len()).map(|p| models[p % n][p]).collect()
}

/// Checks the whole device against `model` hot, then again cold: synced, every block evicted,
/// so each page comes from the object store.
fn verify_hot_and_cold(rig: &Rig, model: &[Option<u64>], what: &str) {
    let f = rig.open();
    let pages = model.len() as u64;
    verify(&f, 0, pages, |p| model[p as usize], &format!("{what}, hot"));
    rig.sync();
    let evicted = rig.evict_all();
    verify(
        &f,
        0,
        pages,
        |p| model[p as usize],
        &format!("{what}, cold ({evicted} blocks evicted)"),
    );
}

/// `writers` threads, each owning the pages `p % writers == w` of `[0, pages)` (so every
/// block is shared by several writers; each page holds `initial` at the start), write random
/// owned pages for `run`; with `readback`
/// each write is read back at once, and every 64 writes the writer re-reads all its pages.
/// Returns the merged model and the number of writes.
fn write_load(
    rig: &Rig,
    writers: u64,
    pages: u64,
    run: Duration,
    readback: bool,
    initial: Option<u64>,
) -> (Vec<Option<u64>>, u64) {
    let start = Arc::new(Barrier::new(writers as usize));
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let f = rig.open();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut model = vec![initial; pages as usize];
                let mut rng = Rng::new(w + 1);
                let mut buf = AlignedBuf::new(4096);
                let mut rd = AlignedBuf::new(4096);
                let owned = (pages - w).div_ceil(writers);
                start.wait();
                let until = Instant::now() + run;
                let mut n = 0u64;
                while Instant::now() < until {
                    let page = w + rng.below(owned) * writers;
                    let gen = next_gen();
                    write_page(&f, &mut buf, page, gen);
                    model[page as usize] = Some(gen);
                    n += 1;
                    if readback {
                        // The page just written (Dirty), then three older ones (mostly Clean
                        // or evicted by now).
                        for k in 0..4 {
                            let q = if k == 0 {
                                page
                            } else {
                                w + rng.below(owned) * writers
                            };
                            f.read_exact_at(&mut rd.as_mut_slice()[..4096], q * 4096)
                                .unwrap_or_else(|e| panic!("read back page {q}: {e}"));
                            if let Some(d) = describe(&rd.as_slice()[..4096], q, model[q as usize])
                            {
                                panic!("writer {w}, read after write #{n}: {d}");
                            }
                        }
                    }
                    if n.is_multiple_of(64) {
                        for q in (w..pages).step_by(writers as usize) {
                            f.read_exact_at(&mut rd.as_mut_slice()[..4096], q * 4096)
                                .unwrap_or_else(|e| panic!("re-read page {q}: {e}"));
                            if let Some(d) = describe(&rd.as_slice()[..4096], q, model[q as usize])
                            {
                                panic!("writer {w}, re-read after write #{n}: {d}");
                            }
                        }
                    }
                }
                (model, n)
            })
        })
        .collect();
    let mut models = Vec::new();
    let mut writes = 0;
    for h in handles {
        let (m, n) = h.join().expect("writer thread panicked");
        models.push(m);
        writes += n;
    }
    (merge(models), writes)
}

/// Rotation race under load. Interleaving: a rotation (Dirty -> Syncing, active file becomes
/// the flushing file) or a flush completion (Syncing -> Clean) lands between a writer's gate
/// entry and the moment its data is in the active file, for many writers at once and
/// rotations back to back. A write that lands in the file being flushed, or a block that flush
/// completion marks Clean after a newer write, reads back as an older generation (the write
/// is silently rolled back). Every page must read its last write, hot and then cold.
fn rotation_race_under_load(t: Transport) {
    let size = 2 << 20;
    let rig = Rig::new(t, size);
    let churn = rig.churn(false);
    let (model, writes) = write_load(&rig, 8, size / 4096, Duration::from_secs(12), false, None);
    let syncs = churn.end();
    println!("rotation race [{t}]: {writes} writes by 8 writers during {syncs} syncs");
    assert!(
        syncs >= MIN_SYNCS,
        "only {syncs} syncs ran: rotations were not continuous"
    );
    verify_hot_and_cold(&rig, &model, "rotation race");
    rig.finish("rotation race");
}

/// Write vs flush of the same block (promote-before-write). Interleaving: a partial write to
/// a block that is Syncing (its bytes in the flushing file, being uploaded) or just turned
/// Clean. The block must be promoted (its current bytes copied into the active file) before
/// the new page lands, and flush completion must leave a block that was written again Dirty.
/// Two blocks, four writers on alternate pages, syncs back to back; writers re-read their
/// pages every 64 writes, and everything is checked hot and cold at the end.
fn write_vs_flush_of_the_same_block(t: Transport) {
    let rig = Rig::new(t, 4 << 20);
    let churn = rig.churn(false);
    let (model, writes) = write_load(&rig, 4, 2 * PER_BLOCK, Duration::from_secs(10), false, None);
    let syncs = churn.end();
    println!("write vs flush [{t}]: {writes} writes into 2 blocks during {syncs} syncs");
    assert!(syncs >= MIN_SYNCS, "only {syncs} syncs ran");
    verify_hot_and_cold(&rig, &model, "write vs flush");
    rig.finish("write vs flush");
}

/// Read vs rotation. Interleaving: a rotation, flush completion or eviction lands between
/// planning a read (the plan names a cache file and an offset) and the read's I/O. The plan's
/// gate must be held until the I/O is done: otherwise the read may run after flush completion
/// closed and deleted the file it names, or after eviction punched the block's hole, and
/// return zeros (or another file's bytes). Every page is written once first; then each writer
/// reads back the page it just wrote and three older pages of its own after every write, and
/// two scanners read the whole device in 256 KiB requests (no sector may read as zeros, no
/// page as another page), while syncs and evictions run back to back.
fn read_after_write_during_rotations(t: Transport) {
    let size = 2 << 20;
    let pages = size / 4096;
    let rig = Rig::new(t, size);
    // Every page written once (generation 0): from here on no page may ever read as zeros.
    glidefs_testkit::blockdev::write_blocks(&rig.open(), 0, 0, pages, 16);
    rig.sync();
    let churn = rig.churn(true);
    let stop = Arc::new(AtomicBool::new(false));
    let scanners: Vec<_> = (0..2)
        .map(|_| {
            let (f, stop) = (rig.open(), Arc::clone(&stop));
            std::thread::spawn(move || scan_until(&f, pages, &stop))
        })
        .collect();
    let (model, writes) = write_load(&rig, 4, pages, Duration::from_secs(10), true, Some(0));
    stop.store(true, Ordering::Release);
    let scans: u64 = scanners
        .into_iter()
        .map(|h| h.join().expect("scanner thread panicked"))
        .sum();
    let syncs = churn.end();
    println!(
        "read after write [{t}]: {writes} writes, each read back, {scans} whole-device scans, during {syncs} syncs"
    );
    assert!(syncs >= MIN_SYNCS, "only {syncs} syncs ran");
    verify_hot_and_cold(&rig, &model, "read after write");
    rig.finish("read after write");
}

/// Reads the whole device in 256 KiB requests until `stop`, failing on any page with a
/// 512-byte sector of zeros or with another page's number in its header; returns the number
/// of whole-device scans. A page that a writer rewrites during the scan may read torn (a mix
/// of its old and new generation: reads and writes that overlap are not atomic on a block
/// device), but every version of it is a full pattern, so no mix has a zero sector.
fn scan_until(f: &File, pages: u64, stop: &AtomicBool) -> u64 {
    let io_pages = 64u64;
    let mut buf = AlignedBuf::new((io_pages * 4096) as usize);
    let mut scans = 0;
    while !stop.load(Ordering::Acquire) {
        for first in (0..pages).step_by(io_pages as usize) {
            let n = io_pages.min(pages - first);
            let got = &mut buf.as_mut_slice()[..(n * 4096) as usize];
            f.read_exact_at(got, first * 4096)
                .unwrap_or_else(|e| panic!("scan: read pages {first}+{n}: {e}"));
            for i in 0..n {
                let (p, s) = (first + i, (i * 4096) as usize);
                let have = &got[s..s + 4096];
                let zero_sector = have.chunks(512).position(|c| c.iter().all(|&b| b == 0));
                let h = header(have);
                if zero_sector.is_some() || h.block != Some(p) {
                    panic!(
                        "scan {scans}: written page {p} (block {}) reads wrong: zero sector \
                         {zero_sector:?}, header gen {} page {:?}",
                        p / PER_BLOCK,
                        h.generation,
                        h.block
                    );
                }
            }
        }
        scans += 1;
    }
    scans
}

/// Concurrent read and write of a block that was just flushed and evicted (the cold path).
/// Interleaving: a READ of an evicted block fetches it from the store (gate-free) and fills
/// the cache, while a WRITE of one page of the same block runs; if the fill stored the
/// fetched (older) bytes over the newer write, the write would be lost. Two threads read the
/// block and a fourth reads another cold block at the same time (cold reads must not share
/// scratch memory). Many rounds, each on freshly evicted blocks.
fn read_and_write_of_an_evicted_block(t: Transport) {
    let blocks = 32u64;
    let rig = Rig::new(t, blocks * u64::from(BLOCK));
    let mut model: Vec<Option<u64>> = vec![None; (blocks * PER_BLOCK) as usize];
    let f = Arc::new(rig.open());
    let mut rng = Rng::new(77);
    let rounds = 200;
    let mut buf = AlignedBuf::new(BLOCK as usize);
    let mut torn = 0;
    for round in 0..rounds {
        let b = rng.below(blocks);
        let other = (b + 1 + rng.below(blocks - 1)) % blocks;
        // Whole blocks b and other at a new generation, flushed, evicted.
        for blk in [b, other] {
            let gen = next_gen();
            for i in 0..PER_BLOCK {
                let s = (i * 4096) as usize;
                fill_block(
                    &mut buf.as_mut_slice()[s..s + 4096],
                    gen,
                    blk * PER_BLOCK + i,
                );
                model[(blk * PER_BLOCK + i) as usize] = Some(gen);
            }
            f.write_all_at(buf.as_slice(), blk * u64::from(BLOCK))
                .expect("write block");
        }
        rig.sync();
        rig.evict_all();
        // Race: read b, write one page of b, read other.
        let page = b * PER_BLOCK + rng.below(PER_BLOCK);
        let gen = next_gen();
        let go = Arc::new(Barrier::new(4));
        let reader = |blk: u64| {
            let (f, go) = (Arc::clone(&f), Arc::clone(&go));
            std::thread::spawn(move || {
                let mut rd = AlignedBuf::new(BLOCK as usize);
                go.wait();
                f.read_exact_at(rd.as_mut_slice(), blk * u64::from(BLOCK))
                    .unwrap_or_else(|e| panic!("cold read of block {blk}: {e}"));
                rd.as_slice().to_vec()
            })
        };
        let (rb, rb2, ro) = (reader(b), reader(b), reader(other));
        {
            let mut wb = AlignedBuf::new(4096);
            go.wait();
            write_page(&f, &mut wb, page, gen);
        }
        let got_o = ro.join().expect("reader of other");
        // The racing reads of b see every other page as it was, and the written page as it
        // was, as written, or (a read overlapping a write is not atomic on a block device)
        // a mix of the two: each byte from one of them, never zeros or other bytes.
        for got_b in [
            rb.join().expect("reader of b"),
            rb2.join().expect("reader of b"),
        ] {
            for i in 0..PER_BLOCK {
                let p = b * PER_BLOCK + i;
                let s = (i * 4096) as usize;
                let have = &got_b[s..s + 4096];
                let Some(wrong) = describe(have, p, model[p as usize]) else {
                    continue;
                };
                if p != page || !mix_of(have, p, model[p as usize], gen) {
                    panic!("round {round}: racing cold read of block {b}: {wrong}");
                }
                if describe(have, p, Some(gen)).is_some() {
                    torn += 1;
                }
            }
        }
        for i in 0..PER_BLOCK {
            let p = other * PER_BLOCK + i;
            let s = (i * 4096) as usize;
            if let Some(d) = describe(&got_o[s..s + 4096], p, model[p as usize]) {
                panic!("round {round}: concurrent cold read of block {other}: {d}");
            }
        }
        model[page as usize] = Some(gen);
        verify(
            &f,
            b * PER_BLOCK,
            PER_BLOCK,
            |p| model[p as usize],
            &format!("round {round}: block {b} after the race"),
        );
    }
    println!(
        "evicted-block race [{t}]: {rounds} rounds, {torn} racing reads saw the written page torn"
    );
    drop(f);
    verify_hot_and_cold(&rig, &model, "evicted-block race");
    let s = rig.finish("evicted-block race");
    assert!(s.cold_reads >= rounds, "only {} cold reads", s.cold_reads);
}

/// FLUSH vs rotation. Interleaving: the guest's FLUSH arrives while zero-copy writes are in
/// flight (each holding the gate's read side until its completion is committed) and a
/// rotation is queued on the gate's write side (parking_lot's lock is fair: new readers wait
/// behind it). If FLUSH blocked the queue's loop thread waiting for the gate, the in-flight
/// writes could never complete, the rotation never run and the FLUSH never finish. Writers
/// interleave writes with fdatasync on the device while syncs run back to back.
///
/// The load runs in a child process (this test binary re-run for this one test) that prints
/// its progress every second; the test fails when no write or fdatasync completes for 30 s.
/// A wedged device's I/O threads cannot be killed (they sleep uninterruptibly in the kernel,
/// waiting for the server that is this very process), so an in-process watchdog could not
/// end the process: the child is left behind and the test runner goes on.
fn flush_vs_rotation_does_not_deadlock(t: Transport) {
    if std::env::var_os(CHILD_ENV).is_some() {
        return flush_vs_rotation_load(t);
    }
    let module = match t {
        Transport::ZeroCopy => "zero_copy",
        Transport::UserCopy => "user_copy",
    };
    watch_child(&format!("{module}::flush_vs_rotation_does_not_deadlock"));
}

/// The body of `flush_vs_rotation_does_not_deadlock`, run in the child process.
fn flush_vs_rotation_load(t: Transport) {
    let size = 2 << 20;
    let rig = Rig::new(t, size);
    let churn = rig.churn(false);
    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    // Progress for the watching parent (`watch_child`), once a second during the load.
    println!("{LOAD_START}");
    let reporter = {
        let (progress, done) = (Arc::clone(&progress), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                println!("{PROGRESS}{}", progress.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let writers = 4u64;
    let pages = size / 4096;
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let f = rig.open();
            let progress = Arc::clone(&progress);
            std::thread::spawn(move || {
                let mut model = vec![None; pages as usize];
                let mut rng = Rng::new(100 + w);
                let mut buf = AlignedBuf::new(4096);
                let owned = pages / writers;
                let until = Instant::now() + Duration::from_secs(12);
                let (mut writes, mut flushes) = (0u64, 0u64);
                while Instant::now() < until {
                    for _ in 0..=rng.below(4) {
                        let page = w + rng.below(owned) * writers;
                        let gen = next_gen();
                        write_page(&f, &mut buf, page, gen);
                        model[page as usize] = Some(gen);
                        writes += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    f.sync_data().expect("fdatasync (FLUSH)");
                    flushes += 1;
                    progress.fetch_add(1, Ordering::Relaxed);
                }
                (model, writes, flushes)
            })
        })
        .collect();
    let mut models = Vec::new();
    let (mut writes, mut flushes) = (0, 0);
    for h in handles {
        let (m, w, f) = h.join().expect("writer thread panicked");
        models.push(m);
        writes += w;
        flushes += f;
    }
    done.store(true, Ordering::Release);
    reporter.join().expect("progress reporter");
    println!("{LOAD_END}");
    let syncs = churn.end();
    println!("flush vs rotation [{t}]: {writes} writes, {flushes} fdatasyncs, {syncs} syncs");
    assert!(syncs >= MIN_SYNCS, "only {syncs} syncs ran");
    let model = merge(models);
    verify_hot_and_cold(&rig, &model, "flush vs rotation");
    let s = rig.finish("flush vs rotation");
    // Concurrent fdatasyncs may share one FLUSH (the block layer merges pending flushes).
    assert!(
        s.op(IoOp::Flush).count > 0,
        "none of the {flushes} fdatasyncs reached the target as a FLUSH"
    );
}

/// Set in the child process of a test that runs its load under `watch_child`.
const CHILD_ENV: &str = "GLIDEFS_RACES_CHILD";
const LOAD_START: &str = "load: start";
const LOAD_END: &str = "load: end";
const PROGRESS: &str = "progress: ";

/// Runs test `name` of this binary in a child process and follows its output: between its
/// `LOAD_START` and `LOAD_END` lines the `PROGRESS` counter must change at least every
/// [`STALL_LIMIT`], else the child is killed (it may stay behind, stuck in the kernel) and
/// the test fails as a deadlock. Fails too when the child fails or runs past 10 minutes.
fn watch_child(name: &str) {
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = std::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            name,
        ])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the child test process");
    // Both streams through this process: a child left behind must not hold the runner's
    // own output pipe open (whoever reads it would wait for its end forever).
    let err = child.stderr.take().expect("child stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("  child! {line}");
        }
    });
    let out = child.stdout.take().expect("child stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            println!("  child| {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let began = Instant::now();
    let mut loading = false;
    let mut last = (String::new(), Instant::now());
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(line) if line == LOAD_START => (loading, last.1) = (true, Instant::now()),
            Ok(line) if line == LOAD_END => loading = false,
            Ok(line) if line.starts_with(PROGRESS) && line != last.0 => {
                last = (line, Instant::now());
            }
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let stalled = loading && last.1.elapsed() > STALL_LIMIT;
        if stalled || began.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            panic!(
                "DEADLOCK: {name}: no write or fdatasync completed for {STALL_LIMIT:?} \
                 (last {:?}, loading {loading}); child {} killed and left behind",
                last.0,
                child.id()
            );
        }
    }
    let status = child.wait().expect("wait for the child test process");
    assert!(
        status.success(),
        "{name} failed in the child process: {status}"
    );
}

macro_rules! on_both_transports {
    ($($test:ident),* $(,)?) => {
        mod zero_copy {
            $(
                #[test]
                #[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
                fn $test() {
                    super::$test(ublk_core::Transport::ZeroCopy);
                }
            )*
        }
        mod user_copy {
            $(
                #[test]
                #[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
                fn $test() {
                    super::$test(ublk_core::Transport::UserCopy);
                }
            )*
        }
    };
}

on_both_transports!(
    rotation_race_under_load,
    write_vs_flush_of_the_same_block,
    read_after_write_during_rotations,
    read_and_write_of_an_evicted_block,
    flush_vs_rotation_does_not_deadlock,
);
