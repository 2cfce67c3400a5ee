//! Crash injection at every durability edge (data write, WAL append, WAL sync, rotation, pack
//! upload, manifest publish, flush completion, checkpoint, hole punch): the volume "dies" at the
//! edge, is dropped without shutdown and reopened from the same directory and store. No write
//! acknowledged by a completed flush (or flush to store) may be lost; any other write reads as
//! its old or new content (see `common::Oracle`). Afterwards the volume flushes to the store
//! and a fresh host sees the same bytes, so no manifest points at a missing pack.

mod common;

use std::sync::Arc;

use common::*;
use glidefs_volume::cache::{CrashAt, CrashPoint};
use glidefs_volume::Volume;

async fn scenario(v: &Volume, oracle: &mut Oracle) -> bool {
    let mut seed = 100;
    for round in 0..6usize {
        for p in [
            round * 5 % PAGES,
            (round * 11 + 3) % PAGES,
            (round * 17 + 40) % PAGES,
        ] {
            seed += 1;
            let pages = 1 + round % 3;
            let p = p.min(PAGES - pages);
            let mut buf = Vec::new();
            let datas: Vec<_> = (p..p + pages).map(|q| page_data(seed, q)).collect();
            for d in &datas {
                buf.extend_from_slice(d);
            }
            let ok = v.write((p * PAGE) as u64, &buf).await.is_ok();
            for (k, d) in datas.into_iter().enumerate() {
                if ok {
                    oracle.write(p + k, d);
                } else {
                    oracle.maybe_write(p + k, d);
                }
            }
            if !ok {
                return false;
            }
        }
        let ok = match round % 3 {
            0 => v.flush().await.is_ok(),
            1 => v.sync_to_store().await.is_ok(),
            _ => v.flush().await.is_ok() && v.evict_to(2 * BS as u64).await.is_ok(),
        };
        if !ok {
            return false;
        }
        oracle.durable();
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_at_any_crash_point() {
    for point in CrashPoint::ALL {
        for nth in 0..2 {
            let ctx = format!("{point:?}#{nth}");
            let store = mem();
            let dir = tempfile::tempdir().unwrap();
            let mut oracle = Oracle::new();
            let hook = Arc::new(CrashAt::new(point, nth));
            let mut cfg = config(dir.path());
            cfg.crash_hook = hook.clone();
            let v = Volume::open(cfg, store.clone()).await.unwrap();
            let finished = scenario(&v, &mut oracle).await;
            assert!(
                hook.fired() && !finished,
                "{ctx}: crash point never reached"
            );
            v.kill().await;
            drop(v);

            let v = open(dir.path(), store.clone()).await;
            let img = read_all(&v).await;
            oracle.check_after_crash(&img, &ctx);
            // the recovered volume keeps working and flushes to the store
            v.write(0, &page_data(999, 0)).await.unwrap();
            oracle.write(0, page_data(999, 0));
            v.sync_to_store().await.unwrap();
            v.kill().await;
            drop(v);
            let fresh = tempfile::tempdir().unwrap();
            let v = open(fresh.path(), store).await;
            oracle.assert_pages(0, &read_all(&v).await, &format!("{ctx}: fresh host"));
        }
    }
}

/// A daemon killed after completing a write (no FLUSH yet) is replaced by a successor that
/// recovers the ublk device; the guest's next FLUSH goes to the successor and must cover the
/// write. So a completed write that made a block Dirty must survive a crash of the process
/// (not of the host): its WAL record has to reach the kernel before the write completes.
/// Found by the kernel kill -9 loop (an fdatasync-acknowledged write read back as an older
/// flushed version); fails when `commit_write` only buffers the Dirty record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_write_survives_a_process_crash_before_its_flush() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    // Flushed to the store and evicted: the block's only local state is "remote".
    v.write(0, &page_data(1, 0)).await.unwrap();
    v.sync_to_store().await.unwrap();
    // A newer write completes; the process dies before any FLUSH.
    v.write(0, &page_data(2, 0)).await.unwrap();
    v.kill().await;
    drop(v);
    let v = open(dir.path(), store).await;
    v.flush().await.unwrap(); // the guest's FLUSH, answered by the successor
    let mut buf = vec![0u8; 4096];
    v.read(0, &mut buf).await.unwrap();
    assert!(
        buf == page_data(2, 0),
        "the completed write was lost by the crash (reads the flushed version)"
    );
}
