//! Cold reads against a store whose pack GETs the test holds in flight (`GatedStore`), and
//! against a cache whose fill of `clean.data` fails (`CrashHook::io_fault`):
//! - a read that starts after a write completed (flushed to the store, evicted locally)
//!   returns that write, never the bytes of an older fetch still in flight, whether that
//!   fetch is a read's or a readahead run's; and the older fetch does not install its bytes
//!   in the cache;
//! - a readahead run whose pack GC deleted while its GET was held reads each block where the
//!   manifest names it now, so a read that joined the run gets bytes, not an error; a block
//!   mapped nowhere now (overwritten with zeros and flushed) reads as zeros, whether a read
//!   joined a run or fetched it alone, or unmapped between a read's look at it and its
//!   fetch; a block marked remote that the manifest maps nowhere fails as corrupt;
//! - a cold read whose fill into `clean.data` fails still returns the fetched bytes (the
//!   block just stays uncached); a partial write that needs that fill fails with its error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::{BlockState, FaultEffect, FaultOn, IoOp};
use glidefs_testkit::{noise, GatedStore};
use glidefs_volume::{Volume, VolumeError, VolumeErrorKind};

use common::*;

/// Hang guard only (never a timed assertion).
const HANG: Duration = Duration::from_secs(120);

/// Waits until a read of a cold block either joined a fetch in flight (counted as
/// coalesced) or sent its own GET (the `held`-th held GET).
async fn joined_or_fetched(v: &Volume, gate: &GatedStore, held: u64) {
    tokio::time::timeout(HANG, async {
        while v.stats().await.fetches_coalesced == 0 && gate.held() < held {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the second read neither joined a fetch nor sent a GET");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_a_completed_write_never_joins_an_older_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 0, None).await;
    const X: u64 = 3;
    let (old, new) = (noise(1, BSU), noise(2, BSU));
    write_flush_evict(&v, X, &old).await;

    // R1: a cold read of X whose GET stays in flight.
    gate.close();
    let r1 = tokio::spawn({
        let v = v.clone();
        async move { read_block(&v, X).await }
    });
    tokio::time::timeout(HANG, gate.wait_held(1))
        .await
        .expect("R1's GET reached the store");

    // A write of X completes, is flushed to the store and evicted locally.
    write_flush_evict(&v, X, &new).await;

    // R2 starts after that write completed.
    let r2 = tokio::spawn({
        let v = v.clone();
        async move { read_block(&v, X).await }
    });
    joined_or_fetched(&v, &gate, 2).await;
    gate.open();
    let (got1, got2) = (r1.await.unwrap(), r2.await.unwrap());
    assert!(got1 == old || got1 == new, "R1 overlapped the write");
    assert!(
        got2 == new,
        "a read started after a completed write returned older bytes (it joined a fetch \
         started before the write)"
    );
    // R1's fill was refused (its token predates the flush and the eviction); R2's filled
    // the block with the write.
    assert!(
        v.stats().await.fills_refused >= 1,
        "R1's fill was not refused"
    );
    assert_eq!(v.cache().block_info(X).state, BlockState::Clean);
    assert_eq!(
        read_block(&v, X).await,
        new,
        "the cache holds the older bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_a_completed_write_never_joins_an_older_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 2, None).await;
    // Blocks 2 and 3 in one pack, back to back: readahead fetches them in one run.
    let (old, new) = (noise(3, 2 * BSU), noise(4, 2 * BSU));
    write_flush_evict(&v, 2, &old).await;

    // Three sequential reads, of blocks 0, 0 again and 1 (never written: zeros, no GET) make
    // a stream: readahead fetches blocks 2..4 in the background, and the run's GET stays
    // in flight.
    gate.close();
    for b in [0, 0, 1] {
        assert_eq!(read_block(&v, b).await, vec![0; BSU]);
    }
    assert_eq!(
        v.stats().await.readahead_started,
        2,
        "blocks 2 and 3 read ahead"
    );
    tokio::time::timeout(HANG, gate.wait_held(1))
        .await
        .expect("the readahead GET reached the store");

    // A write of blocks 2 and 3 completes, is flushed and evicted.
    write_flush_evict(&v, 2, &new).await;

    let r2 = tokio::spawn({
        let v = v.clone();
        async move { read_block(&v, 2).await }
    });
    joined_or_fetched(&v, &gate, 2).await;
    gate.open();
    assert!(
        r2.await.unwrap() == new[..BSU],
        "a read started after a completed write returned older bytes (it joined a readahead \
         fetch started before the write)"
    );
    // The readahead run did not install the old bytes (both its fills refused). The run is a
    // task of its own: R2 may return before it has tried its fills.
    tokio::time::timeout(HANG, async {
        while v.stats().await.fills_refused < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the run's fills were not refused");
    assert_eq!(read_block(&v, 2).await, new[..BSU]);
    assert_eq!(read_block(&v, 3).await, new[BSU..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_whose_fill_fails_returns_the_fetched_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(FaultOn::new(IoOp::Fill, FaultEffect::NoSpace));
    let (v, _gate) = gated_volume(dir.path(), 0, Some(hook.clone())).await;
    const X: u64 = 5;
    let data = noise(5, 2 * BSU);
    write_flush_evict(&v, X, &data).await;

    hook.arm();
    // A read across both blocks, and one of part of a block.
    let mut buf = vec![0; 2 * BSU];
    v.read(X * u64::from(BS), &mut buf)
        .await
        .expect("a cold read whose fill fails still returns the fetched bytes");
    assert!(
        buf == data,
        "the read returned other bytes than the store's"
    );
    let mut part = vec![0; 4096];
    v.read(X * u64::from(BS) + 8192, &mut part).await.unwrap();
    assert!(part == data[8192..8192 + 4096]);
    assert_eq!(v.cache().block_info(X).state, BlockState::NotPresent);
    assert!(v.stats().await.fills_failed >= 2);
    // A partial write needs the block locally: it fails with the fill's error.
    let err = v
        .write(X * u64::from(BS) + 512, &[7; 512])
        .await
        .expect_err("a partial write whose fill fails");
    assert!(err.to_string().contains("injected ENOSPC"), "{err}");

    // Space is back: the next read fills the block, writes work again.
    hook.disarm();
    assert_eq!(read_block(&v, X).await, data[..BSU]);
    assert_eq!(v.cache().block_info(X).state, BlockState::Clean);
    v.write(X * u64::from(BS) + 512, &[7; 512]).await.unwrap();
    let mut want = data[..BSU].to_vec();
    want[512..1024].fill(7);
    assert_eq!(read_block(&v, X).await, want);
}

/// A cold read looks its block (5) up, and while its GET is held the block is zeroed
/// (WRITE_ZEROES: unmapped), flushed, and its pack deleted by GC: the read overlapped that write, and
/// gets zeros, the block's contents now, instead of an error for the pack it looked up.
#[tokio::test]
async fn a_read_whose_block_was_unmapped_and_its_pack_deleted_returns_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate, held) = held_op_on_blocks_4_5(dir.path(), 7, |v| async move {
        let mut buf = vec![0; BSU];
        v.read(5 * u64::from(BS), &mut buf).await.map(|()| buf)
    })
    .await;
    // (A flush stores its rotation's first block even when zero: block 4, not block 5.)
    unmap_5_and_delete_its_pack(&v, &gate).await;
    gate.open();

    let got = tokio::time::timeout(HANG, held)
        .await
        .expect("the held read finished")
        .expect("the read task")
        .expect("the held read succeeded");
    assert_eq!(got, vec![0; BSU], "the held read");
    for pass in ["cached", "cold"] {
        for b in [4, 5] {
            assert_eq!(read_block(&v, b).await, vec![0; BSU], "{pass} block {b}");
        }
        v.evict_to(0).await.unwrap();
    }
    assert_eq!(v.stats().await.fills_failed, 0);
}

/// The gap between a read's look at a block (cold, remote) and its fetch's manifest lookup:
/// a zero write flushed in between unmaps the block, and the fetch returns zeros (the block's
/// new contents) and fills nothing; it once failed with `MissingLocation` (an -EIO to the
/// guest). `fetch_block` is called on the unmapped block directly, as a read whose plan
/// predates the flush calls it (the gap has no pause point to hold it open).
#[tokio::test]
async fn a_fetch_of_a_block_unmapped_since_the_reader_saw_it_remote_returns_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (v, _gate) = gated_volume(dir.path(), 0, None).await;
    write_flush_evict(&v, 4, &noise(8, 2 * BSU)).await;
    v.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    v.sync_to_store().await.unwrap();
    let info = v.cache().block_info(5);
    assert_eq!(info.state, BlockState::NotPresent, "block 5");
    assert!(!info.remote, "block 5 unmapped");

    assert_eq!(v.fetch_block(5).await.unwrap(), vec![0; BSU]);
    assert_eq!(
        v.cache().block_info(5).state,
        BlockState::NotPresent,
        "nothing filled"
    );
    assert_eq!(read_block(&v, 5).await, vec![0; BSU]);
}

/// The other side of the same check: a block the cache says is only in the store while the
/// manifest maps it nowhere is an inconsistency, and a fetch of it fails as corrupt rather
/// than reading as zeros.
#[tokio::test]
async fn a_fetch_of_a_block_marked_remote_but_mapped_nowhere_fails_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (v, _gate) = gated_volume(dir.path(), 0, None).await;
    v.cache().set_remote([7]);
    let e = v.fetch_block(7).await.unwrap_err();
    assert!(
        matches!(&e, VolumeError::Fetch { block: 7, source }
            if matches!(**source, VolumeError::MissingLocation { block: 7, .. })),
        "{e}"
    );
    assert_eq!(e.kind(), VolumeErrorKind::Corrupt, "{e}");
}

/// A readahead run whose pack GC deleted while its GET was in flight: the run's GET finds
/// the pack gone and each of its blocks is read where the manifest names it now, so a read
/// that joined the run gets the block's bytes, not an error. Blocks 8-15 (packs of 4 blocks:
/// two runs) are read ahead and held at the gate; reads of blocks 9 and 10 join the first
/// run; then every one of them is overwritten (block 10 with zeros: the flush unmaps it, so
/// the run finds it nowhere) and flushed, and GC deletes both old packs. The read of block 9
/// gets its new bytes (block 10, found nowhere, does not fail the whole run), and the read
/// of block 10 gets zeros (its pack gone, the block mapped nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readahead_run_whose_pack_gc_deleted_reads_its_blocks_where_they_are_now() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 8, None).await;
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    let (old, mut new) = (noise(5, 8 * BSU), noise(6, 8 * BSU));
    new[2 * BSU..3 * BSU].fill(0);
    write_flush_evict(&v, 8, &old).await;

    // Blocks 8..16 read ahead as two runs, both held.
    hold_readahead_of_8_to_16(&v, &gate).await;
    let [joined, joined_unmapped] = [9, 10].map(|b| {
        let v = v.clone();
        tokio::spawn(async move { read_block(&v, b).await })
    });
    wait_coalesced(
        &v,
        2,
        "the reads of blocks 9 and 10 joined the readahead run",
    )
    .await;

    // Blocks 8-15 overwritten (10 unmapped) and flushed; GC deletes the packs the runs read.
    v.write(8 * u64::from(BS), &new).await.unwrap();
    v.sync_to_store().await.unwrap();
    let gc = gc_hard(&store).await;
    assert_eq!(gc.packs_deleted.len(), 2, "{gc:?}");
    gate.open();

    // The joined read overlapped the overwrite: it returns the new bytes (the old ones are
    // gone from the store), and so does every later read, cached or cold.
    let got = tokio::time::timeout(HANG, joined)
        .await
        .expect("the joined read finished")
        .expect("the joined read succeeded");
    assert!(got[..] == new[BSU..2 * BSU], "block 9 through the run");
    // Block 10 is mapped nowhere now: zeros, its contents since the overwrite, not an error.
    let got = tokio::time::timeout(HANG, joined_unmapped)
        .await
        .expect("the joined read of block 10 finished")
        .expect("the joined read of block 10 succeeded");
    assert_eq!(got, vec![0; BSU], "block 10 through the run");
    for pass in ["cached", "cold"] {
        for b in 8..16u64 {
            let i = (b - 8) as usize;
            assert!(
                read_block(&v, b).await[..] == new[i * BSU..(i + 1) * BSU],
                "{pass} block {b}"
            );
        }
        v.evict_to(0).await.unwrap();
    }
}
