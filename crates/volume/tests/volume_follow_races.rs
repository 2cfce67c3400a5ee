//! A read-only export adopting the writer's newer generations (`follow.rs`): remote bits
//! that must end up as the served map says, whatever the adoption meets. Written by the
//! fresh-eyes review of the `drop_clean(blocks, unmapped)` fix:
//! - a `follow` whose caller gave up (a timeout) must not let its adoption's blocking part
//!   run beside the next adoption (it cleared a bit the next one had set: the block read as
//!   zeros under a map that names it); fixed by the `looking` guard moving into that part;
//! - an adoption that failed at its WAL sync, then one that unmapped nothing, then a crash:
//!   the replay set the failed one's cleared bit again (every read of the block failed);
//!   fixed by a view's open clearing the bits of blocks its map names nowhere.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_volume::cache::{CrashHook, CrashPoint, FaultEffect, FaultOn, IoOp};
use glidefs_volume::Volume;
use parking_lot::Mutex;

/// Parks the next `to_park` fills (past the fill's epoch check, holding the block's stripe
/// lock), the i-th until `go(i)`.
#[derive(Debug)]
struct PauseFill {
    to_park: AtomicUsize,
    arrived: AtomicUsize,
    reached: Mutex<(mpsc::Sender<usize>, mpsc::Receiver<usize>)>,
    go_tx: Vec<Mutex<mpsc::Sender<()>>>,
    go_rx: Vec<Mutex<mpsc::Receiver<()>>>,
}

impl PauseFill {
    fn new() -> Arc<Self> {
        let (tx, rx): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel()).unzip();
        Arc::new(Self {
            to_park: 0.into(),
            arrived: 0.into(),
            reached: Mutex::new(mpsc::channel()),
            go_tx: tx.into_iter().map(Mutex::new).collect(),
            go_rx: rx.into_iter().map(Mutex::new).collect(),
        })
    }
    fn arm(&self, n: usize) {
        self.to_park.store(n, Ordering::SeqCst);
    }
    /// Waits until fill `i` is parked.
    async fn parked(&self, i: usize) {
        loop {
            if let Ok(got) = self.reached.lock().1.try_recv() {
                assert_eq!(got, i);
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    fn go(&self, i: usize) {
        self.go_tx[i].lock().send(()).unwrap();
    }
}

impl CrashHook for PauseFill {
    fn should_crash(&self, _: CrashPoint) -> bool {
        false
    }
    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if op == IoOp::Fill
            && self
                .to_park
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let i = self.arrived.fetch_add(1, Ordering::SeqCst);
            self.reached.lock().0.send(i).unwrap();
            self.go_rx[i].lock().recv().unwrap();
        }
        None
    }
}

/// Writer A on `dir` with every block written (seed 1) and published (G1).
async fn writer_with_every_block(
    dir: &std::path::Path,
    store: &Arc<dyn object_store::ObjectStore>,
) -> (Arc<Volume>, Oracle) {
    let a = open_as(dir, store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    let all: Vec<usize> = (0..BLOCKS as usize).collect();
    write_blocks(&a, &mut oracle, 1, &all).await;
    a.sync_to_store().await.unwrap();
    (a, oracle)
}

/// 1. A: all blocks (seed 1), G1. Export B opens at G1.
/// 2. A zeroes block 5 (unmapped), G2. B's cold read of block 5 (G1's location): its fill
///    is parked past its check, holding block 5's stripe lock.
/// 3. B's `follow` (under a timeout, as any caller may drop the future) adopts G2: clears
///    block 5's bit, swaps the map, and its `drop_clean(&[5], &[5])` waits on the stripe
///    lock on the blocking pool. The timeout drops `follow`: `looking` is released, the
///    blocking task goes on.
/// 4. A writes block 5 again (seed 3), G3. B follows to G3: `set_remote(5)` under the lock.
/// 5. The fill goes. The orphaned G2 `drop_clean` clears block 5's bit *after* G3 set it.
///
/// Before the `looking` guard went with the blocking part, B served G3, which maps block 5
/// (seed 3), but block 5 was NotPresent without REMOTE: it read as zeros (G2's contents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_follow_does_not_clear_a_bit_the_next_adoption_set() {
    let store = mem();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (a, mut oracle) = writer_with_every_block(dirs[0].path(), &store).await;

    let hook = PauseFill::new();
    let mut cfg = config(dirs[1].path());
    cfg.read_only = true;
    cfg.readahead_blocks = 0;
    cfg.follow_interval = Duration::from_secs(3600);
    cfg.crash_hook = hook.clone();
    let b = Volume::open(cfg, store.clone()).await.unwrap();

    // Blocks 4-5 zeroed: 4 is stored (a rotation's first block), 5 unmapped.
    a.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    a.sync_to_store().await.unwrap();
    assert!(!a.cache().block_info(5).remote, "A unmapped block 5");
    let g2 = a.manifest_generation();

    hook.arm(1);
    let reader = {
        let b = b.clone();
        tokio::spawn(async move { read_block(&b, 5).await })
    };
    hook.parked(0).await;

    let first = tokio::time::timeout(Duration::from_millis(300), b.follow()).await;
    assert!(
        first.is_err(),
        "the adoption waits for the parked fill: {first:?}"
    );
    assert_eq!(b.manifest_generation(), g2);

    write_blocks(&a, &mut oracle, 3, &[5]).await;
    a.sync_to_store().await.unwrap();
    let g3 = a.manifest_generation();
    let second = {
        let b = b.clone();
        tokio::spawn(async move { b.follow().await })
    };
    // The next look waits for the orphaned adoption (it holds `looking`), which waits for
    // the parked fill: nothing is adopted until the fill goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let during = b.manifest_generation();
    // (Released before any assertion: a parked fill would hold the runtime's shutdown.)
    hook.go(0);
    assert_eq!(during, g2, "the next look waits for the last");
    let _old = reader.await.unwrap(); // started before G2: G1's bytes are fine
    let second = second.await.unwrap();
    assert_eq!(second.as_ref().ok(), Some(&g3), "{second:?}");
    assert!(b.cache().block_info(5).remote, "G3 maps block 5");
    // The orphaned G2 drop_clean finishes too.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let info = b.cache().block_info(5);
    let got = read_block(&b, 5).await;
    let want = oracle.cur[5 * PPB..6 * PPB].concat();
    assert!(
        got == want,
        "B serves G{} (block 5 = seed 3; the second follow: {:?}); block 5 is {:?} \
         remote={}; it reads as {}",
        b.manifest_generation(),
        second.map_err(|e| e.to_string()),
        info.state,
        info.remote,
        if got.iter().all(|&x| x == 0) {
            "zeros (G2)"
        } else {
            "other bytes"
        }
    );
}

/// 1. A: all blocks (seed 1), G1. Export B opens at G1, caches block 5 (a Fill record).
/// 2. A zeroes block 5, G2. B's disk fails its WAL syncs: B's follow adopts G2 (block 5's
///    bit cleared in memory, the map swapped) but `drop_clean` fails at its sync: no
///    checkpoint, no base file. The disk recovers.
/// 3. A writes block 6, G3. B follows: nothing unmapped, so no checkpoint; the base file
///    records G3.
/// 4. B crashes (`kill`) and reopens: the base is at the store's latest (Current), so the
///    cache's remote bits come from its checkpoint and WAL: the Fill record of block 5
///    replays as Clean + REMOTE, its Evict as NotPresent: block 5 is remote with no location.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_adoption_then_a_good_one_and_a_crash_leave_no_remote_bit_unmapped() {
    let store = mem();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (a, mut oracle) = writer_with_every_block(dirs[0].path(), &store).await;

    let disk = Arc::new(FaultOn::new(IoOp::WalSync, FaultEffect::NoSpace));
    let mut cfg = config(dirs[1].path());
    cfg.read_only = true;
    cfg.readahead_blocks = 0;
    cfg.follow_interval = Duration::from_secs(3600);
    cfg.crash_hook = disk.clone();
    let b = Volume::open(cfg.clone(), store.clone()).await.unwrap();
    oracle.assert_pages(5 * PPB, &read_block(&b, 5).await, "block 5 cached");

    // Blocks 4-5 zeroed: 4 is stored (a rotation's first block), 5 unmapped.
    a.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    a.sync_to_store().await.unwrap();
    assert!(!a.cache().block_info(5).remote, "A unmapped block 5");
    disk.arm();
    let first = b.follow().await;
    disk.disarm();
    assert!(
        first.is_err(),
        "drop_clean fails at its WAL sync: {first:?}"
    );

    write_blocks(&a, &mut oracle, 4, &[6]).await;
    a.sync_to_store().await.unwrap();
    let g3 = b.follow().await.unwrap();
    assert_eq!(g3, a.manifest_generation());
    let before = b.read(5 * u64::from(BS), &mut vec![0; BSU]).await;
    assert!(before.is_ok(), "before the crash: {before:?}");

    b.kill().await;
    drop(b);
    cfg.crash_hook = Arc::new(glidefs_volume::cache::NoCrash);
    let b = Volume::open(cfg, store.clone()).await.unwrap();
    let info = b.cache().block_info(5);
    let mut buf = vec![0xAA; BSU];
    let read = b.read(5 * u64::from(BS), &mut buf).await;
    assert!(
        read.is_ok() && buf.iter().all(|&x| x == 0),
        "reopened at G{} (block 5 unmapped): block 5 is {:?} remote={}; read: {:?}",
        b.manifest_generation(),
        info.state,
        info.remote,
        read.map_err(|e| e.to_string())
    );
}
