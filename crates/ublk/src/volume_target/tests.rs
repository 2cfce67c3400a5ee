//! Native tests of the target's engine-facing steps (no kernel): the chunks they produce are
//! run here the way the queue runs them (pread/pwrite on the chunks' files, zeroes), against a
//! real volume on an in-memory store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_testkit::rng::Rng;
use glidefs_testkit::{noise, GatedStore};
use glidefs_volume::cache::{
    BlockState, CrashHook, CrashPoint, FaultEffect, FaultOn, IoOp as CacheIoOp, LockMode, WritePrep,
};
use glidefs_volume::{Volume, VolumeConfig};
use ublk_core::testing::{self, Harness};
use ublk_core::{Chunk, IoDesc, IoOp};

use super::read::ColdReady;
use super::target::VolumeTarget;
use super::write::write_action;
use super::{Inner, Keep};

pub(super) const BS: u64 = 64 << 10;
pub(super) const SIZE: u64 = 16 * BS;

pub(super) struct Fixture {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) volume: Arc<Volume>,
    pub(super) target: VolumeTarget,
    pub(super) dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    fixture_on(Arc::new(object_store::memory::InMemory::new()), None)
}

/// A fixture on `store`, with the cache's crash/fault hook `hook`.
fn fixture_on(
    store: Arc<dyn object_store::ObjectStore>,
    hook: Option<Arc<dyn CrashHook>>,
) -> Fixture {
    fixture_with(store, hook, 4)
}

/// The volume config of the fixtures: [`SIZE`] bytes in blocks of [`BS`], no readahead.
pub(super) fn config(dir: &std::path::Path) -> VolumeConfig {
    let mut cfg = VolumeConfig::new("t", dir, SIZE);
    cfg.block_size = BS as u32;
    cfg.readahead_blocks = 0;
    cfg
}

/// A volume on `store` (cache hook `hook`) and its target with one queue of `depth` tags,
/// on a runtime with 2 workers and tokio's default blocking pool (as `runtime::serving`).
pub(super) fn fixture_with(
    store: Arc<dyn object_store::ObjectStore>,
    hook: Option<Arc<dyn CrashHook>>,
    depth: u16,
) -> Fixture {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    if let Some(hook) = hook {
        cfg.crash_hook = hook;
    }
    let volume = rt.block_on(Volume::open(cfg, store)).unwrap();
    let target = VolumeTarget::new(
        Arc::clone(&volume),
        rt.handle().clone(),
        1,
        depth,
        256 << 10,
        false,
        &glidefs_model::api::QosLimits::default(),
    )
    .unwrap();
    Fixture {
        rt,
        volume,
        target,
        dir,
    }
}

/// A request of queue 0 (the fixtures' only queue).
pub(super) use testing::request as io;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Runs `req`'s chunks like the queue (checked, then moved with pread/pwrite).
fn run_chunks(req: &IoDesc, chunks: &[Chunk], buf: &mut [u8]) {
    testing::run_chunks(req, chunks, buf).unwrap();
}

#[test]
fn cold_pieces_are_staged_in_scratch_never_in_the_active_file() {
    // Fills fail: the fetched blocks stay remote, so the READ is served from scratch.
    let hook = Arc::new(FaultOn::new(CacheIoOp::Fill, FaultEffect::NoSpace));
    let f = fixture_on(
        Arc::new(object_store::memory::InMemory::new()),
        Some(hook.clone()),
    );
    let data = pattern(7, 2 * BS as usize);
    write_flush_evict(&f, 1, &data); // blocks 1 and 2
    hook.arm();

    // Blocks 0 (hole), 1 and 2 (remote).
    let req = io(IoOp::Read, BS - 4096, (2 * BS) as u32, 3);
    let buf = f.rt.block_on(cold_read_checked(
        Arc::clone(&f.target.inner),
        req,
        move |inner, ready| {
            assert_eq!(ready.cold, 2 * BS - 4096, "both remote pieces staged");
            assert!(ready.keep._scratch.is_some());
            let scratch = inner.queues[0].scratch().unwrap().file();
            let active = ready.keep.gate.active_arc();
            // (chunk, file offset) of the chunks reading `file`.
            let reading = |file| {
                ready.chunks.iter().filter_map(move |c| {
                    c.file()
                        .filter(|(f, _)| Arc::ptr_eq(f, file))
                        .map(|(_, off)| (c, off))
                })
            };
            assert!(reading(scratch).next().is_some());
            assert!(reading(active).next().is_none());
            // Scratch offsets are inside tag 3's slot.
            for (c, file_offset) in reading(scratch) {
                assert!(file_offset >= 3 * (256 << 10));
                assert!(file_offset + u64::from(c.len()) <= 4 * (256 << 10));
            }
        },
    ));
    assert!(buf[..4096].iter().all(|b| *b == 0), "hole reads as zeroes");
    assert_eq!(&buf[4096..], &data[..(2 * BS - 4096) as usize]);
    // Nothing was written to the active file: the blocks are still not local.
    assert_eq!(f.volume.cache().block_info(1).state, BlockState::NotPresent);
    assert_eq!(f.volume.cache().block_info(2).state, BlockState::NotPresent);
}

#[test]
fn local_reads_need_no_scratch() {
    let f = fixture();
    let data = pattern(3, 8192);
    f.rt.block_on(f.volume.write(4096, &data)).unwrap();
    let req = io(IoOp::Read, 0, 16384, 0);
    let buf = f.rt.block_on(cold_read_checked(
        Arc::clone(&f.target.inner),
        req,
        |_, ready| {
            assert_eq!(ready.cold, 0);
            assert!(ready.keep._scratch.is_none());
        },
    ));
    assert!(buf[..4096].iter().all(|b| *b == 0));
    assert_eq!(&buf[4096..12288], &data[..]);
    assert!(buf[12288..].iter().all(|b| *b == 0));
}

#[test]
fn a_write_lands_and_commits_under_its_gate() {
    let f = fixture();
    let cache = f.volume.cache();
    let req = io(IoOp::Write, 3 * BS + 512, 8192, 1);
    let gate = cache.try_enter().unwrap();
    let WritePrep::Ready(ticket) = cache
        .prepare_write(&gate, req.offset, u64::from(req.len), LockMode::Wait)
        .unwrap()
    else {
        panic!("a fresh block needs no fetch");
    };
    let (chunks, keep) = write_action(&req, gate, ticket);
    assert_eq!(chunks.len(), 1);
    assert_eq!((chunks[0].len(), chunks[0].buf_offset()), (8192, 0));
    let mut data = pattern(9, 8192);
    run_chunks(&req, &chunks, &mut data);
    let mut lp = Harness::default();
    lp.next();
    assert_eq!(lp.land_write(&f.target, req, 8192, Some(keep)), Ok(8192));
    assert_eq!(cache.block_info(3).state, BlockState::Dirty);
    let mut back = vec![0u8; 8192];
    f.rt.block_on(f.volume.read(req.offset, &mut back)).unwrap();
    assert_eq!(back, data);
}

#[test]
fn a_failed_transfer_or_a_write_without_its_ticket_is_eio() {
    let f = fixture();
    let cache = f.volume.cache();
    let req = io(IoOp::Write, 5 * BS, 4096, 0);
    let gate = cache.try_enter().unwrap();
    let WritePrep::Ready(ticket) = cache
        .prepare_write(&gate, req.offset, 4096, LockMode::Wait)
        .unwrap()
    else {
        panic!("a fresh block needs no fetch");
    };
    let (_chunks, keep) = write_action(&req, gate, ticket);
    let mut lp = Harness::default();
    lp.next();
    let failed = lp.land_write(&f.target, req, -libc::EIO, Some(keep));
    assert_eq!(failed, Ok(-libc::EIO));
    assert_eq!(
        cache.block_info(5).state,
        BlockState::NotPresent,
        "an uncommitted write changes no state"
    );
    // A READ's keepalive (a gate, no ticket) cannot commit a WRITE.
    let read_keep = Keep::read(cache.try_enter().unwrap(), None);
    let no_ticket = lp.land_write(&f.target, req, 4096, Some(read_keep));
    assert_eq!(no_ticket, Ok(-libc::EIO));
    assert_eq!(cache.block_info(5).state, BlockState::NotPresent);
    assert_eq!(lp.land_write(&f.target, req, 4096, None), Ok(-libc::EIO));
}

#[test]
fn zeroing_writes_zeroes_only_where_needed() {
    let f = fixture();
    let data = pattern(5, 2 * BS as usize);
    f.rt.block_on(f.volume.write(0, &data)).unwrap();
    f.rt.block_on(f.target.inner.zero_range(4096, (BS + 4096) as u32))
        .unwrap();
    // A range never written stays untouched (no block becomes Dirty).
    f.rt.block_on(f.target.inner.zero_range(8 * BS, (4 * BS) as u32))
        .unwrap();
    assert_eq!(f.volume.cache().block_info(8).state, BlockState::NotPresent);
    let mut back = vec![0u8; 2 * BS as usize];
    f.rt.block_on(f.volume.read(0, &mut back)).unwrap();
    let mut want = data.clone();
    want[4096..(BS + 8192) as usize].fill(0);
    assert_eq!(back, want);
}

/// A cold READ the way `read_cold` runs it: the engine's request protocol
/// (`Volume::serve_read`) with `stage_cold` under the final plan's gate, whose chunks run like
/// the queue runs them (`check` sees them first). Returns the bytes the request would
/// complete with.
async fn cold_read_checked(
    inner: Arc<Inner>,
    req: IoDesc,
    check: impl Fn(&Inner, &ColdReady) + Send + Sync + 'static,
) -> Vec<u8> {
    let volume = Arc::clone(&inner.volume);
    volume
        .serve_read(req.offset, u64::from(req.len), (), move |(), ready| {
            let staged = inner.stage_cold(&req, ready).expect("stage the cold read");
            check(&inner, &staged);
            let mut buf = vec![0xAAu8; req.len as usize];
            run_chunks(&req, &staged.chunks, &mut buf);
            buf
        })
        .await
        .map_err(|refused| refused.error)
        .expect("the cold read")
}

/// [`cold_read_checked`] without checks.
async fn cold_read(inner: Arc<Inner>, req: IoDesc) -> Vec<u8> {
    cold_read_checked(inner, req, |_, _| {}).await
}

/// Hang guard only (never a timed assertion).
const HANG: Duration = Duration::from_secs(120);

/// Writes `data` at block `block`, flushes it to the store and evicts every local copy.
fn write_flush_evict(f: &Fixture, block: u64, data: &[u8]) {
    f.rt.block_on(async {
        f.volume.write(block * BS, data).await.unwrap();
        f.volume.sync_to_store().await.unwrap();
        f.volume.evict_to(0).await.unwrap();
    });
    assert_eq!(
        f.volume.cache().block_info(block).state,
        BlockState::NotPresent
    );
}

#[test]
fn a_cold_read_after_a_completed_write_never_joins_an_older_fetch() {
    let gate = Arc::new(GatedStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        "/packs/",
    ));
    let f = fixture_on(gate.clone(), None);
    const X: u64 = 4;
    let (old, new) = (noise(1, BS as usize), noise(2, BS as usize));
    write_flush_evict(&f, X, &old);
    let req = io(IoOp::Read, X * BS, BS as u32, 2);

    // R1: a cold READ of X whose GET stays in flight.
    gate.close();
    let r1 = f.rt.spawn(cold_read(Arc::clone(&f.target.inner), req));
    f.rt.block_on(async { tokio::time::timeout(HANG, gate.wait_held(1)).await })
        .expect("R1's GET reached the store");

    // A write of X completes, is flushed to the store and evicted locally.
    write_flush_evict(&f, X, &new);

    // R2 starts after that write completed: it joins R1's fetch or sends its own GET.
    let r2 = f.rt.spawn(cold_read(
        Arc::clone(&f.target.inner),
        io(IoOp::Read, X * BS, BS as u32, 3),
    ));
    f.rt.block_on(async {
        tokio::time::timeout(HANG, async {
            while f.volume.stats().await.fetches_coalesced == 0 && gate.held() < 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
    })
    .expect("R2 neither joined a fetch nor sent a GET");
    gate.open();
    let got1 = f.rt.block_on(r1).unwrap();
    let got2 = f.rt.block_on(r2).unwrap();
    assert!(got1 == old || got1 == new, "R1 overlapped the write");
    assert!(
        got2 == new,
        "a READ started after a completed write returned older bytes (it joined a fetch \
         started before the write)"
    );
    // R1's fetch did not install the old bytes in the cache.
    let again = f.rt.block_on(cold_read(Arc::clone(&f.target.inner), req));
    assert!(again == new, "the cache holds the older bytes");
}

#[test]
fn a_cold_read_whose_fill_fails_is_served_from_the_fetched_bytes() {
    let hook = Arc::new(FaultOn::new(CacheIoOp::Fill, FaultEffect::NoSpace));
    let f = fixture_on(
        Arc::new(object_store::memory::InMemory::new()),
        Some(hook.clone()),
    );
    let data = noise(6, 2 * BS as usize);
    write_flush_evict(&f, 6, &data);
    hook.arm();
    // Blocks 6 (part) and 7 (part), both remote.
    let req = io(IoOp::Read, 6 * BS + 4096, BS as u32, 1);
    let got = f.rt.block_on(cold_read(Arc::clone(&f.target.inner), req));
    assert!(
        got[..] == data[4096..4096 + BS as usize],
        "the READ returned other bytes than the store's"
    );
    assert_eq!(f.volume.cache().block_info(6).state, BlockState::NotPresent);
    assert_eq!(f.volume.cache().block_info(7).state, BlockState::NotPresent);
}

/// Records which thread ran each cache file operation.
#[derive(Debug, Default)]
struct ThreadLog {
    ops: parking_lot::Mutex<Vec<(CacheIoOp, String)>>,
}

impl ThreadLog {
    fn on(&self, thread: &str) -> Vec<CacheIoOp> {
        self.ops
            .lock()
            .iter()
            .filter(|(_, t)| t == thread)
            .map(|(op, _)| *op)
            .collect()
    }
}

impl CrashHook for ThreadLog {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: CacheIoOp) -> Option<std::io::Error> {
        let me = std::thread::current().name().unwrap_or("?").to_string();
        self.ops.lock().push((op, me));
        None
    }
}

/// The loop thread reads and writes no cache file for 4 KiB writes to Clean blocks (each a
/// promote, then a WAL record), to never-written blocks past the active file's end (an
/// extension, then a WAL record) and to the Dirty blocks they leave: every such step runs
/// on other threads, and the data reads back.
#[test]
fn the_loop_thread_does_no_file_io_for_small_writes() {
    const LOOP: &str = "test-loop-thread";
    let log = Arc::new(ThreadLog::default());
    let f = fixture_on(
        Arc::new(object_store::memory::InMemory::new()),
        Some(log.clone()),
    );
    // Blocks 0..8 Clean (written whole, flushed to the store, kept in the cache).
    let clean = noise(3, 8 * BS as usize);
    f.rt.block_on(async {
        f.volume.write(0, &clean).await.unwrap();
        f.volume.sync_to_store().await.unwrap();
    });
    for b in 0..8 {
        assert_eq!(f.volume.cache().block_info(b).state, BlockState::Clean);
    }
    log.ops.lock().clear();
    let mut want = clean.clone();
    want.resize(SIZE as usize, 0);
    // Clean blocks 0..8, never-written blocks 8..16, then all of them again (Dirty now).
    let offsets: Vec<u64> = (0..16)
        .chain(0..16)
        .map(|b| b * BS + 4096 * (b % 3 + 1))
        .collect();
    let target = &f.target;
    let results: Vec<i32> = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(LOOP.into())
            .spawn_scoped(s, || {
                let mut lp = Harness::default();
                offsets
                    .iter()
                    .enumerate()
                    .map(|(i, &off)| {
                        let mut data = pattern(i as u8, 4096);
                        want[off as usize..off as usize + 4096].copy_from_slice(&data);
                        let req = io(IoOp::Write, off, 4096, (i % 4) as u16);
                        lp.run(target, req, &mut data).unwrap()
                    })
                    .collect()
            })
            .unwrap()
            .join()
            .unwrap()
    });
    assert!(results.iter().all(|&r| r == 4096), "results: {results:?}");
    let on_loop = log.on(LOOP);
    let elsewhere: Vec<CacheIoOp> = log.ops.lock().iter().map(|(op, _)| *op).collect();
    println!("cache file operations: on the loop thread {on_loop:?}; in all {elsewhere:?}");
    assert!(
        on_loop.is_empty(),
        "the loop thread did cache file I/O: {on_loop:?}"
    );
    for op in [CacheIoOp::Promote, CacheIoOp::WalWrite, CacheIoOp::Cover] {
        assert!(
            elsewhere.contains(&op),
            "no {op:?} was seen at all (the hook missed it): {elsewhere:?}"
        );
    }
    let mut back = vec![0u8; SIZE as usize];
    f.rt.block_on(f.volume.read(0, &mut back)).unwrap();
    assert!(back == want, "the volume reads back other bytes");
}

/// Runs `req` through the target the way the queue loop does, on a thread of its own (a
/// loop slot waiting for the answer); `None` when no answer came within [`HANG`].
fn run_on_thread(
    target: &'static VolumeTarget,
    req: IoDesc,
    mut buf: Vec<u8>,
) -> std::sync::mpsc::Receiver<(i32, Vec<u8>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lp = Harness::default();
        let r = lp.run(target, req, &mut buf).expect("the harness");
        let _ = tx.send((r, buf));
    });
    rx
}

/// A deferred WRITE whose attempt panics (the promote of its Clean block) completes with
/// -EIO through its dropped token (no request is leaked), leaves the block unchanged, and
/// holds no gate or stripe lock: the same WRITE then succeeds and a flush to the store runs.
#[test]
fn a_deferred_write_whose_attempt_panics_completes_with_eio_and_holds_nothing() {
    let hook = Arc::new(FaultOn::new(CacheIoOp::Promote, FaultEffect::Panic));
    let f = fixture_on(
        Arc::new(object_store::memory::InMemory::new()),
        Some(hook.clone()),
    );
    let old = noise(21, BS as usize);
    f.rt.block_on(async {
        f.volume.write(2 * BS, &old).await.unwrap();
        f.volume.sync_to_store().await.unwrap();
    });
    assert_eq!(f.volume.cache().block_info(2).state, BlockState::Clean);
    hook.arm();

    let mut lp = Harness::default();
    let req = io(IoOp::Write, 2 * BS + 4096, 4096, 1);
    let mut data = vec![0xC3u8; 4096];
    let r = lp.run(&f.target, req, &mut data).unwrap();
    assert_eq!(r, -libc::EIO, "a WRITE whose attempt panicked");
    assert_eq!(f.volume.cache().block_info(2).state, BlockState::Clean);
    let mut back = vec![0u8; BS as usize];
    let r = lp
        .run(&f.target, io(IoOp::Read, 2 * BS, BS as u32, 2), &mut back)
        .unwrap();
    assert_eq!(r, BS as i32);
    assert!(
        back == old,
        "a WRITE that failed in prepare changed the block"
    );

    hook.disarm();
    let r = lp.run(&f.target, req, &mut data).unwrap();
    assert_eq!(r, 4096, "the same WRITE again (its stripe lock is free)");
    let mut want = old.clone();
    want[4096..8192].copy_from_slice(&data);
    let r = lp
        .run(&f.target, io(IoOp::Read, 2 * BS, BS as u32, 2), &mut back)
        .unwrap();
    assert_eq!(r, BS as i32);
    assert!(back == want);
    f.rt.block_on(async {
        tokio::time::timeout(HANG, f.volume.sync_to_store())
            .await
            .expect("a gate was left held: the rotation waits forever")
            .unwrap();
    });
    let t0 = std::time::Instant::now();
    while f.target.in_flight() > 0 {
        assert!(t0.elapsed() < HANG, "a deferred task never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A deferred WRITE (a partial write of a cold block) and a cold READ of the same block,
/// both waiting for the block's GET, when `cut` runs (the volume fenced, or the cache
/// latched dead by a hand-off); then the GET returns. Returns both results and the READ's
/// bytes; no request may be left without an answer, no deferred task running.
fn cut_while_fetching(cut: impl FnOnce(&Volume)) -> (i32, i32, Vec<u8>, Vec<u8>) {
    let gate = Arc::new(GatedStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        "/packs/",
    ));
    let f: &'static Fixture = Box::leak(Box::new(fixture_on(gate.clone(), None)));
    let target = &f.target;
    let old = noise(22, BS as usize);
    write_flush_evict(f, 5, &old);

    gate.close();
    let w = run_on_thread(
        target,
        io(IoOp::Write, 5 * BS + 4096, 4096, 1),
        vec![0x77; 4096],
    );
    let r = run_on_thread(
        target,
        io(IoOp::Read, 5 * BS, BS as u32, 2),
        vec![0; BS as usize],
    );
    let t0 = std::time::Instant::now();
    while target.in_flight() < 2 || gate.held() < 1 {
        assert!(t0.elapsed() < HANG, "the requests never reached the store");
        std::thread::sleep(Duration::from_millis(1));
    }
    cut(&f.volume);
    gate.open();
    let (wr, _) = w.recv_timeout(HANG).expect("the WRITE got no answer");
    let (rr, got) = r.recv_timeout(HANG).expect("the READ got no answer");
    let t0 = std::time::Instant::now();
    while target.in_flight() > 0 {
        assert!(t0.elapsed() < HANG, "a deferred task never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
    (wr, rr, got, old)
}

/// Fenced while they fetch: the WRITE completes with -EIO, the READ with the store's bytes.
#[test]
fn deferred_requests_fenced_while_they_fetch_complete() {
    let (wr, rr, got, old) =
        cut_while_fetching(|v| v.cache().fence("test: another writer took the volume"));
    assert_eq!(wr, -libc::EIO, "a WRITE to a fenced volume");
    assert_eq!(rr, BS as i32, "reads of a fenced volume go on");
    assert!(got == old, "the READ returned other bytes than the store's");
}

/// Latched dead (the hand-off latch) while they fetch: both complete with -EIO.
#[test]
fn deferred_requests_latched_dead_while_they_fetch_complete_with_eio() {
    let (wr, rr, _, _) = cut_while_fetching(|v| v.cache().die());
    assert_eq!(wr, -libc::EIO, "a WRITE to a dead cache");
    assert_eq!(rr, -libc::EIO, "a READ of a dead cache");
}

/// A deferred partial WRITE of a cold block waits on the block's stripe (another write's
/// ticket) in its first attempt on the blocking pool; the runtime shuts down meanwhile. Once
/// the stripe is free the attempt needs a fetch, and the protocol's task on the shut-down
/// runtime is dropped at once: the WRITE completes with -EIO (through its dropped token) and
/// its in-flight guard goes with the task (`VolumeDevice::stop` would not wait forever).
#[test]
fn a_deferred_write_needing_a_fetch_on_a_shut_down_runtime_completes_with_eio() {
    let f = fixture();
    write_flush_evict(&f, 5, &noise(23, BS as usize));
    let Fixture {
        rt,
        volume,
        target,
        dir: _dir,
    } = f;
    let target: &'static VolumeTarget = Box::leak(Box::new(target));
    // A full-block write's ticket holds block 5's stripe (a full block needs no fetch).
    let cache = volume.cache();
    let gate = cache.try_enter().unwrap();
    let WritePrep::Ready(ticket) = cache
        .prepare_write(&gate, 5 * BS, BS, LockMode::Try)
        .unwrap()
    else {
        panic!("a full-block write is ready inline");
    };
    let w = run_on_thread(
        target,
        io(IoOp::Write, 5 * BS + 4096, 4096, 1),
        vec![0x66; 4096],
    );
    let t0 = std::time::Instant::now();
    while target.in_flight() < 1 {
        assert!(t0.elapsed() < HANG, "the WRITE was never deferred");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let its first attempt park on the stripe (setup only; -EIO is right either way).
    std::thread::sleep(Duration::from_millis(200));
    rt.shutdown_background();
    drop(ticket);
    drop(gate);
    let (r, _) = w.recv_timeout(HANG).expect("the WRITE got no answer");
    assert_eq!(r, -libc::EIO, "a WRITE whose protocol could not start");
    let t0 = std::time::Instant::now();
    while target.in_flight() > 0 {
        assert!(
            t0.elapsed() < HANG,
            "a dropped deferred task is still counted in flight"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(volume.cache().block_info(5).state, BlockState::NotPresent);
}

/// A tiny deterministic RNG (xorshift64*).
const PAGE: u64 = 4096;
const PAGES: usize = (SIZE / PAGE) as usize;

/// WRITEs (inline or deferred, partial ones of cold blocks fetching first) and READs
/// (inline or cold) through the target, each on its own loop thread, while the volume is
/// flushed to the store and evicted over and over: no READ returns bytes older than a
/// WRITE completed before it started. `fills_fail`: every fill fails (cold READs are served
/// from the fetched bytes in scratch; the writer writes whole blocks, which need no fill).
fn target_reads_race_writes_flushes_and_evictions(fills_fail: bool, seed: u64) {
    use std::sync::atomic::AtomicU64;
    let hook = Arc::new(FaultOn::new(CacheIoOp::Fill, FaultEffect::NoSpace));
    if fills_fail {
        hook.arm();
    }
    let f: &'static Fixture = Box::leak(Box::new(fixture_on(
        Arc::new(object_store::memory::InMemory::new()),
        Some(hook),
    )));
    let target = &f.target;
    let done: &'static [AtomicU64] = Box::leak(
        (0..PAGES)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>()
            .into(),
    );
    let started: &'static [AtomicU64] = Box::leak(
        (0..PAGES)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>()
            .into(),
    );
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // WRITEs the writer may have issued: a few per flush round, so that most blocks stay
    // cold between rounds (the READs race the writes, the flushes and the evictions).
    let allowed: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let written: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));

    let writer = std::thread::spawn(move || {
        let mut lp = Harness::default();
        let mut rng = Rng(seed | 1);
        let blocks = SIZE / BS;
        let mut generation = 0u64;
        while !stop.load(Ordering::SeqCst) {
            if generation >= allowed.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            generation += 1;
            let (offset, len) = if fills_fail {
                let first = rng.below(blocks);
                (first * BS, (1 + rng.below(2.min(blocks - first))) * BS)
            } else {
                let first = rng.below(PAGES as u64);
                let n = 1 + rng.below(24.min(PAGES as u64 - first));
                (first * PAGE, n * PAGE)
            };
            let mut data = glidefs_testkit::pattern(offset, generation, len as usize);
            let pages = (offset / PAGE) as usize..((offset + len) / PAGE) as usize;
            for p in pages.clone() {
                started[p].store(generation, Ordering::SeqCst);
            }
            let r = lp
                .run(target, io(IoOp::Write, offset, len as u32, 0), &mut data)
                .unwrap();
            assert_eq!(r, len as i32, "WRITE of generation {generation}");
            for p in pages {
                done[p].store(generation, Ordering::SeqCst);
            }
            written.store(generation, Ordering::SeqCst);
        }
        generation
    });
    let readers: Vec<_> = (1..=2u16)
        .map(|tag| {
            std::thread::spawn(move || {
                let mut lp = Harness::default();
                let mut rng = Rng((seed ^ (u64::from(tag) * 0x9E37)) | 1);
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let first = rng.below(PAGES as u64) as usize;
                    let n = 1 + rng.below(40.min((PAGES - first) as u64)) as usize;
                    let floor: Vec<u64> = (first..first + n)
                        .map(|p| done[p].load(Ordering::SeqCst))
                        .collect();
                    let offset = first as u64 * PAGE;
                    let len = n as u64 * PAGE;
                    let mut buf = vec![0xAAu8; len as usize];
                    let r = lp
                        .run(target, io(IoOp::Read, offset, len as u32, tag), &mut buf)
                        .unwrap();
                    assert_eq!(r, len as i32, "READ at {offset}");
                    let ceiling: Vec<u64> = (first..first + n)
                        .map(|p| started[p].load(Ordering::SeqCst))
                        .collect();
                    glidefs_testkit::pattern::check_generations(
                        offset,
                        &buf,
                        PAGE,
                        &floor,
                        &ceiling,
                        &format!("READ tag {tag}"),
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let rounds = 40;
    for _ in 0..rounds {
        // Half of this round's WRITEs done, the others race the flush and the eviction.
        let want = allowed.fetch_add(4, Ordering::SeqCst) + 2;
        let t0 = std::time::Instant::now();
        while written.load(Ordering::SeqCst) < want {
            assert!(t0.elapsed() < HANG, "the writer is stuck");
            std::thread::sleep(Duration::from_micros(200));
        }
        f.rt.block_on(async {
            f.volume.sync_to_store().await.unwrap();
            f.volume.evict_to(0).await.unwrap();
        });
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::SeqCst);
    let writes = writer.join().expect("the writer");
    let reads: u64 = readers
        .into_iter()
        .map(|r| r.join().expect("a reader"))
        .sum();
    let stats = target.stats();
    println!(
        "fills_fail {fills_fail}: {rounds} flush+evict rounds, {writes} WRITEs, {reads} READs, \
         {} cold, {} bytes from scratch, {} deferred",
        stats.cold_reads, stats.scratch_bytes, stats.deferred
    );
    // The race ran: cold READs, and with failing fills READs served from scratch.
    assert!(writes > 0 && reads > 0 && stats.cold_reads > 0);
    assert!(!fills_fail || stats.scratch_bytes > 0);
    // Settled: everything reads as the last writes.
    let mut lp = Harness::default();
    let mut img = vec![0u8; SIZE as usize];
    for (i, part) in img.chunks_mut(256 << 10).enumerate() {
        let off = i as u64 * (256 << 10);
        let r = lp
            .run(target, io(IoOp::Read, off, part.len() as u32, 3), part)
            .unwrap();
        assert_eq!(r, part.len() as i32);
    }
    let last: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
    glidefs_testkit::pattern::check_generations(0, &img, PAGE, &last, &last, "the settled volume");
}

#[test]
fn target_reads_racing_writes_flushes_and_evictions_are_never_older_than_a_completed_write() {
    for seed in 1..=2 {
        target_reads_race_writes_flushes_and_evictions(false, seed);
    }
}

#[test]
fn target_reads_served_from_scratch_are_never_older_than_a_completed_write() {
    for seed in 1..=2 {
        target_reads_race_writes_flushes_and_evictions(true, seed);
    }
}
