//! A fetch that finds its block's pack gone and the block mapped nowhere returns zeros
//! (`Located::Unmapped`), and those zeros never stand in for non-zero data. Each test holds
//! a pack GET at the gate (`GatedStore`), makes the manifest map the block nowhere
//! (WRITE_ZEROES + flush) and GC delete the pack, and then:
//! - a partial write whose fetch came back `Unmapped` lands on zeros (nothing was filled, so
//!   the write attempts again and merges with what the cache holds now);
//! - the same, with the block written again (not flushed) before the GET ends: the partial
//!   write merges with that write, never with the zeros of its fetch;
//! - a cold read whose fetch came back `Unmapped` after a newer write completed (not
//!   flushed) is planned again and serves that write from the cache;
//! - a read that starts after the block was written again, flushed and evicted (the
//!   manifest maps it to the new pack) gets the new bytes, and so does the older read whose
//!   GET was held (its pack gone, it follows the block to its new location, not zeros);
//! - a partial write that joined a readahead run whose block was unmapped lands on zeros.
//!
//! Hang guards only (no timed assertions).

mod common;

use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::BlockState;
use glidefs_testkit::noise;
use glidefs_volume::Volume;

use common::*;
use futures::future::BoxFuture;

/// Hang guard only (never a timed assertion).
const HANG: Duration = Duration::from_secs(120);

/// A partial write of `pw` into block `block` (it needs a fetch when the block is cold), as
/// an operation for `held_op_on_blocks_4_5`.
fn partial_write(
    block: u64,
    pw: &[u8],
) -> impl FnOnce(Arc<Volume>) -> BoxFuture<'static, glidefs_volume::Result<()>> {
    let pw = pw.to_vec();
    move |v| Box::pin(async move { v.write(block * u64::from(BS) + PW_AT as u64, &pw).await })
}

/// A whole read of block 5, as an operation for `held_op_on_blocks_4_5`.
async fn read_5(v: Arc<Volume>) -> Vec<u8> {
    read_block(&v, 5).await
}

async fn finish<T>(h: tokio::task::JoinHandle<T>, what: &str) -> T {
    tokio::time::timeout(HANG, h)
        .await
        .unwrap_or_else(|_| panic!("{what} finished"))
        .unwrap_or_else(|e| panic!("{what} task: {e}"))
}

/// Reads block `b` cached, then cold, and checks it against `want` both times.
async fn check_cached_and_cold(v: &Volume, b: u64, want: &[u8]) {
    for pass in ["cached", "cold"] {
        assert!(read_block(v, b).await[..] == want[..], "{pass} block {b}");
        v.sync_to_store().await.unwrap();
        v.evict_to(0).await.unwrap();
    }
}

/// A partial write of block 5 whose fetch finds P0 gone and the block unmapped: nothing is
/// filled, the write attempts again, finds the block unmapped locally too, and lands on
/// zeros (WRITE_ZEROES, which it overlapped, then the partial write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_whose_block_was_unmapped_lands_on_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let pw = noise(12, PW_LEN);
    let (v, gate, held) = held_op_on_blocks_4_5(dir.path(), 11, partial_write(5, &pw)).await;
    unmap_5_and_delete_its_pack(&v, &gate).await;
    gate.open();
    finish(held, "the partial write")
        .await
        .expect("the partial write succeeded");
    // Its fetch succeeded without reading a block: `Located::Unmapped`, not an error.
    assert_eq!(v.stats().await.blocks_fetched, 0, "the fetch read nothing");

    let want = overlaid(&vec![0; BSU], &pw);
    check_cached_and_cold(&v, 5, &want).await;
    assert_eq!(v.stats().await.fills_failed, 0);
}

/// As above, but block 5 is also written again (whole block, not flushed) before the held
/// GET ends: the fetch still finds the block mapped nowhere (the manifest lags the cache)
/// and returns zeros, yet the partial write must merge with the newer write in the cache,
/// not with the fetch's zeros: the block reads as `new` with the partial write over it (or
/// `new` alone: the two writes overlapped), never with zeros where `new` was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_whose_block_was_unmapped_then_rewritten_keeps_the_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let (pw, new) = (noise(22, PW_LEN), noise(23, BSU));
    let (v, gate, held) = held_op_on_blocks_4_5(dir.path(), 21, partial_write(5, &pw)).await;
    unmap_5_and_delete_its_pack(&v, &gate).await;
    v.write(5 * u64::from(BS), &new).await.unwrap();
    assert_eq!(v.cache().block_info(5).state, BlockState::Dirty);
    gate.open();
    finish(held, "the partial write")
        .await
        .expect("the partial write succeeded");
    assert_eq!(
        v.stats().await.blocks_fetched,
        0,
        "the fetch read nothing: Unmapped"
    );

    let got = read_block(&v, 5).await;
    let merged = overlaid(&new, &pw);
    assert!(
        got == merged || got == new,
        "block 5 is neither the rewrite with the partial write over it nor the rewrite"
    );
    check_cached_and_cold(&v, 5, &got).await;
    assert_eq!(v.stats().await.fills_failed, 0);
}

/// A cold read of block 5 whose GET is held while block 5 is zeroed, flushed (unmapped), its
/// pack deleted, and then written again (not flushed). The fetch returns zeros (the
/// manifest still maps block 5 nowhere), the read plans again, finds block 5 Dirty, and
/// serves it from the cache. A read started after that write completed gets it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_fetch_found_the_block_unmapped_serves_a_newer_write_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let new = noise(32, BSU);
    let (v, gate, held) = held_op_on_blocks_4_5(dir.path(), 31, read_5).await;
    unmap_5_and_delete_its_pack(&v, &gate).await;
    v.write(5 * u64::from(BS), &new).await.unwrap();
    // Started after the write completed: served from the cache, no fetch.
    assert!(read_block(&v, 5).await == new, "a read after the write");
    gate.open();

    let got = finish(held, "the held read").await;
    assert_eq!(
        v.stats().await.blocks_fetched,
        0,
        "the fetch read nothing: Unmapped"
    );
    // It overlapped both writes: zeros or `new` are both right; the protocol plans again
    // after the fetch and finds the block Dirty.
    assert!(
        got == new || got == vec![0; BSU],
        "the held read got neither zeros nor the rewrite"
    );
    assert!(
        got == new,
        "the held read served the newer write (planned again)"
    );
    check_cached_and_cold(&v, 5, &new).await;
}

/// A cold read of block 5 (R1) is held; block 5 is zeroed and flushed (unmapped), its pack
/// deleted, then written again, flushed (mapped to a new pack) and evicted. A read started
/// after that (R2) looks block 5 up at its new location: its own fetch, `new`. R1's GET then
/// finds its pack gone and follows block 5 to where the manifest names it now (`new`):
/// neither read returns zeros, though the block was unmapped in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_an_unmap_and_a_flushed_rewrite_gets_the_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let new = noise(42, BSU);
    let (v, gate, r1) = held_op_on_blocks_4_5(dir.path(), 41, read_5).await;
    unmap_5_and_delete_its_pack(&v, &gate).await;
    write_flush_evict(&v, 5, &new).await;
    let r2 = tokio::spawn({
        let v = v.clone();
        async move { read_block(&v, 5).await }
    });
    tokio::time::timeout(HANG, gate.wait_held(2))
        .await
        .expect("R2 sent its own GET (it did not join R1's fetch)");
    assert_eq!(v.stats().await.fetches_coalesced, 0);
    gate.open();

    let got2 = finish(r2, "R2").await;
    assert!(got2 == new, "R2 started after the rewrite completed");
    let got1 = finish(r1, "R1").await;
    assert!(
        got1 == new || got1 == vec![0; BSU],
        "R1 overlapped both writes"
    );
    assert!(got1 == new, "R1 followed block 5 to its new pack");
    check_cached_and_cold(&v, 5, &new).await;
}

/// Blocks 8-15 are read ahead (two runs of 4, held); a partial write of block 10 joins the
/// first run; blocks 8-11 are zeroed and flushed (8 stored as the rotation's first block,
/// 9-11 unmapped) and GC deletes the run's pack. The run finds its pack gone, reads each
/// block where it is now: 10 is mapped nowhere, zeros, nothing filled. The partial write
/// attempts again and lands on zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_that_joined_a_readahead_run_of_an_unmapped_block_lands_on_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 8, None).await;
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    let old = noise(51, 8 * BSU);
    write_flush_evict(&v, 8, &old).await;
    let pw = noise(52, PW_LEN);

    hold_readahead_of_8_to_16(&v, &gate).await;
    let held = tokio::spawn(partial_write(10, &pw)(v.clone()));
    wait_coalesced(&v, 1, "the partial write joined the readahead run").await;

    v.write_zeroes(8 * u64::from(BS), 4 * u64::from(BS))
        .await
        .unwrap();
    v.sync_to_store().await.unwrap();
    assert!(v.cache().block_info(10).state == BlockState::NotPresent);
    assert!(!v.cache().block_info(10).remote, "block 10 unmapped");
    let gc = gc_hard(&store).await;
    assert_eq!(gc.packs_deleted.len(), 1, "{gc:?}");
    gate.open();
    finish(held, "the partial write")
        .await
        .expect("the partial write succeeded");

    check_cached_and_cold(&v, 10, &overlaid(&vec![0; BSU], &pw)).await;
    for b in [8, 9, 11] {
        assert_eq!(read_block(&v, b).await, vec![0; BSU], "block {b}");
    }
    for b in 12..16u64 {
        let i = (b - 8) as usize;
        assert!(
            read_block(&v, b).await[..] == old[i * BSU..(i + 1) * BSU],
            "block {b}"
        );
    }
    assert_eq!(v.stats().await.fills_failed, 0);
}
