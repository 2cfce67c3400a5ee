//! Cold-read fills never park an async worker.
//!
//! The fetcher stores a fetched block with `Cache::fill_clean`, which takes the block's stripe
//! lock, pwrites the clean file and appends to the WAL. A zero-copy WRITE ticket (or a plain
//! write on the blocking pool) may hold that stripe lock for as long as the kernel moves its
//! data. If the fill ran on a tokio worker, that worker would be parked for all that time, and
//! on a runtime with one worker nothing else would run: the daemon's deferred requests, timers,
//! the HTTP API. The fill therefore runs on the blocking pool.
//!
//! The test holds block 0's stripe lock from another thread (through a write ticket on a block
//! that shares its stripe), starts a cold fetch of block 0 on a current-thread runtime, and
//! requires the runtime to keep running other work after the fetch got its bytes and while the
//! fill waits for the lock. With the fill on the worker, the runtime stalls until the lock
//! holder gives up (after `STALL`), and the test fails.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use glidefs_volume::cache::{BlockState, LockMode, WritePrep};
use glidefs_volume::Volume;

const BS: u32 = 4096;
/// Blocks `b` and `b + STRIPES` share a stripe lock in the cache (1024 stripes).
const STRIPE_MATE: u64 = 1024;
const BLOCKS: u64 = 2 * STRIPE_MATE;
/// How long the lock holder waits for the runtime to show progress before it gives up.
const STALL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
enum Op {
    /// `Volume::read` of part of the cold block.
    Read,
    /// `Volume::fetch_block` (what the zero-copy path uses for `Source::Remote`).
    FetchBlock,
}

fn block0() -> Vec<u8> {
    glidefs_testkit::noise(0x5EED, BS as usize)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A volume whose block 0 is only in the object store.
async fn cold_volume(dir: &std::path::Path) -> Arc<Volume> {
    let mut cfg = common::config(dir);
    cfg.size = BLOCKS * u64::from(BS);
    cfg.block_size = BS;
    cfg.pack_bytes = u64::from(BS);
    cfg.readahead_blocks = 0;
    let v = Volume::open(cfg, common::mem()).await.unwrap();
    v.write(0, &block0()).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let info = v.cache().block_info(0);
    assert!(info.state == BlockState::NotPresent && info.remote);
    v
}

async fn run(op: Op, v: &Volume) -> Vec<u8> {
    match op {
        Op::Read => {
            let mut buf = vec![0u8; 1024];
            v.read(512, &mut buf).await.unwrap();
            buf
        }
        Op::FetchBlock => v.fetch_block(0).await.unwrap()[512..1536].to_vec(),
    }
}

fn cold_fill_leaves_the_worker_free(op: Op) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let v = rt.block_on(cold_volume(dir.path()));

    // Another thread holds block 0's stripe lock until the runtime proves it is alive (or
    // until STALL passed: then it releases the lock so the test ends instead of hanging).
    let (locked_tx, locked_rx) = mpsc::channel::<()>();
    let (alive_tx, alive_rx) = mpsc::channel::<()>();
    let cache = v.cache().clone();
    let holder = std::thread::spawn(move || {
        let gate = cache.enter();
        let off = STRIPE_MATE * u64::from(BS);
        let ticket = match cache
            .prepare_write(&gate, off, u64::from(BS), LockMode::Wait)
            .unwrap()
        {
            WritePrep::Ready(t) => t,
            other => panic!("a full-block write to a fresh block is ready at once: {other:?}"),
        };
        locked_tx.send(()).unwrap();
        let alive = alive_rx.recv_timeout(STALL).is_ok();
        drop(ticket); // never committed
        drop(gate);
        alive
    });
    locked_rx.recv().unwrap();

    let (got, unfilled_while_alive) = rt.block_on(async {
        let task = tokio::spawn({
            let v = v.clone();
            async move { run(op, &v).await }
        });
        // The fetch counts a block once its bytes arrived, right before the fill.
        while v.stats().await.blocks_fetched == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // This timer can only fire while the fill waits if the fill is not on our worker.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let unfilled = v.cache().block_info(0).state == BlockState::NotPresent;
        let _ = alive_tx.send(()); // fails when the holder already gave up
        (task.await.unwrap(), unfilled)
    });
    let alive = holder.join().unwrap();
    assert!(
        alive,
        "{op:?}: the runtime's only worker made no progress for {STALL:?} while a cold fill \
         waited for its block's stripe lock: the fill blocked the async worker"
    );
    assert!(
        unfilled_while_alive,
        "{op:?}: the fill finished while its stripe lock was held"
    );
    assert_eq!(got, block0()[512..1536], "{op:?}: cold bytes");
    assert_eq!(v.cache().block_info(0).state, BlockState::Clean);
    assert_eq!(rt.block_on(v.stats()).fills_refused, 0);
}

#[test]
fn cold_read_fill_does_not_block_the_async_worker() {
    cold_fill_leaves_the_worker_free(Op::Read);
}

#[test]
fn fetch_block_fill_does_not_block_the_async_worker() {
    cold_fill_leaves_the_worker_free(Op::FetchBlock);
}
