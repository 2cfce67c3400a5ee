//! Racing overlapping writes through the volume never wedge the flush to the store: after
//! tasks hammer the same page, `sync_to_store` succeeds and the store holds one whole write.
//! (End-to-end companion of glidefs-cache's `cache_crc_race`, which reproduces the race
//! deterministically enough to fail without the fix; this one rarely hits the window.)

mod common;

use std::sync::Arc;

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
