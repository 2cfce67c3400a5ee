//! Racing overlapping writes through the volume never wedge the flush to the store: after
//! tasks hammer the same page, `sync_to_store` succeeds and the store holds one whole write.
//! (End-to-end companion of glidefs-cache's `cache_crc_race`, which reproduces the race
//! deterministically enough to fail without the fix; this one rarely hits the window.)

mod common;

use std::sync::Arc;

use glidefs_volume::Volume;

use common::*;

const TASKS: usize = 4;
const WRITES: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writes_to_one_page_flush_to_the_store() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    for round in 0..20u8 {
        v.write(0, &[0xEE; PAGE]).await.unwrap(); // Dirty: the racing writes take the hot path
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (v, barrier) = (v.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    // odd tasks write pages 0-1: single- and multi-page writes overlap
                    let len = PAGE * (1 + t % 2);
                    for i in 0..WRITES {
                        let tag = (1 + (t * WRITES + i) % 200) as u8;
                        v.write(0, &vec![tag; len]).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        if let Err(e) = v.sync_to_store().await {
            panic!("round {round}: flush of racing writes failed: {e}");
        }
        let mut local = vec![0; PAGE];
        v.read(0, &mut local).await.unwrap();
        assert!(local.iter().all(|&b| b == local[0]) && local[0] != 0xEE);
        // what the store holds, seen by another host
        let d2 = tempfile::tempdir().unwrap();
        let other = open(d2.path(), store.clone()).await;
        let mut remote = vec![0; PAGE];
        other.read(0, &mut remote).await.unwrap();
        assert_eq!(
            remote, local,
            "round {round}: the store holds the last write"
        );
    }
}

/// Holds an eviction between its write gate and its hole punch (`BeforeHolePunch`) for
/// `hold` once armed, and says when it got there.
#[derive(Debug)]
struct SlowPunch {
    armed: std::sync::atomic::AtomicBool,
    inside: std::sync::atomic::AtomicBool,
    hold: std::time::Duration,
}

impl glidefs_cache::CrashHook for SlowPunch {
    fn should_crash(&self, point: glidefs_cache::CrashPoint) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if point == glidefs_cache::CrashPoint::BeforeHolePunch && self.armed.swap(false, SeqCst) {
            self.inside.store(true, SeqCst);
            std::thread::sleep(self.hold);
        }
        false
    }
}

/// A partial write of a block that is only in the store, while an eviction of that block is
/// between its write gate and its hole punch (NO_FILL set; the real eviction syncs the data
/// files and the WAL there): each fetch's fill is refused until the punch ends. The write
/// must wait for the eviction and then succeed. Before `Volume::fetch_for_write` waited, it
/// fetched and retried at once, ran out of its 16 attempts in milliseconds and failed with
/// `Unsettled` (-EIO to the guest). Found by the loom model of the gate
/// (glidefs-cache `gate_model`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partial_write_during_an_eviction_waits_for_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let hook = Arc::new(SlowPunch {
        armed: false.into(),
        inside: false.into(),
        hold: std::time::Duration::from_millis(500),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    let v = Volume::open(cfg, mem()).await.unwrap();
    let bs = BS as usize;
    v.write(0, &vec![0x11; bs]).await.unwrap();
    v.sync_to_store().await.unwrap();
    hook.armed.store(true, SeqCst);
    let evict = {
        let v = v.clone();
        tokio::spawn(async move { v.evict_to(0).await })
    };
    while !hook.inside.load(SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // Block 0 is NotPresent + remote with NO_FILL: the write needs a fetch that cannot fill.
    v.write(PAGE as u64, &[0x22; PAGE])
        .await
        .expect("a partial write during an eviction must wait for it, not fail");
    assert!(
        evict.await.unwrap().unwrap() >= 1,
        "the eviction evicted nothing"
    );
    let mut got = vec![0; bs];
    v.read(0, &mut got).await.unwrap();
    assert!(
        got[..PAGE].iter().all(|&b| b == 0x11),
        "page 0 lost its data"
    );
    assert!(
        got[PAGE..2 * PAGE].iter().all(|&b| b == 0x22),
        "the write is missing"
    );
    assert!(
        got[2 * PAGE..].iter().all(|&b| b == 0x11),
        "the rest of the block changed"
    );
}
