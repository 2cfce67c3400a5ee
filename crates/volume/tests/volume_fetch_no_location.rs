//! A fetch that finds no location for a block its caller saw cold and remote
//! (`Fetcher::fetch`: zeros, unless the cache still says NotPresent + remote, then
//! `MissingLocation`) never has those zeros stand in for an acknowledged write's non-zero
//! bytes: a `fetch_for_write` throws the zeros away (its write attempts again and merges
//! with what the cache holds then), and a read uses them only for a block it plans remote
//! again, whose zeros were its contents at some point during the read. On data:
//! - a partial write whose `fetch_for_write` found the block unmapped fills nothing and lands
//!   on zeros;
//! - a block unmapped, then written again (not flushed): the fetch returns zeros (the block's
//!   contents between the flush and the rewrite), fills nothing, and neither reads nor a
//!   partial write ever see those zeros in place of the rewrite;
//! - between a flush's manifest swap and its completion (the block Syncing, mapped nowhere)
//!   the fetch returns the rotation's zeros, not `MissingLocation`; a partial write there
//!   merges with the Syncing zeros; the completion leaves a rewritten unmapped block without
//!   the remote bit, and the next flush maps it with its bytes;
//! - a zero write and then a non-zero write, each flushed: the fetch returns zeros only
//!   between the two, and the new bytes once they are published, wherever the block is.
//!
//! `fetch_block` / `fetch_for_write` are called directly on blocks a read or partial write
//! would have seen remote before the flush that unmapped them (the gap between an attempt's
//! plan and its fetch's lookup has no pause point). Hang guards only (no timed assertions).

mod common;

use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::BlockState;
use glidefs_testkit::{noise, GatedStore};
use glidefs_volume::cache::CrashPoint;

use common::*;

/// Hang guard only (never a timed assertion).
const HANG: Duration = Duration::from_secs(120);

/// A partial write of `patch` into block `block` at [`PW_AT`].
async fn partial_write(v: &glidefs_volume::Volume, block: u64, patch: &[u8]) {
    v.write(block * u64::from(BS) + PW_AT as u64, patch)
        .await
        .unwrap();
}

/// Blocks 4-5 (noise of `seed`) flushed and evicted, then zeroed and flushed: block 5 is
/// mapped nowhere and no longer remote (block 4 is stored as the rotation's first block).
async fn unmap_5(v: &glidefs_volume::Volume, seed: u64) {
    write_flush_evict(v, 4, &noise(seed, 2 * BSU)).await;
    v.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    v.sync_to_store().await.unwrap();
    assert_eq!(v.stats().await.mapped_blocks, 1, "block 5 unmapped");
    let info = v.cache().block_info(5);
    assert_eq!(info.state, BlockState::NotPresent, "block 5");
    assert!(!info.remote, "block 5 not remote");
}

/// Reads block `b` cached (as it is now), then cold (after evicting everything), and checks
/// it against `want` both times.
async fn check_cached_and_cold(v: &glidefs_volume::Volume, b: u64, want: &[u8]) {
    assert!(read_block(v, b).await == want, "block {b} (cached)");
    v.evict_to(0).await.unwrap();
    assert!(read_block(v, b).await == want, "block {b} (cold)");
}

/// Flushes block 5's bytes (`want`), which maps it again, evicts it, and checks that a fetch
/// reads `want` at its new location, then reads it cached and cold.
async fn flush_and_fetch_mapped_again(v: &glidefs_volume::Volume, want: &[u8]) {
    v.sync_to_store().await.unwrap();
    assert_eq!(v.stats().await.mapped_blocks, 2, "block 5 mapped again");
    v.evict_to(0).await.unwrap();
    let info = v.cache().block_info(5);
    assert!(
        info.state == BlockState::NotPresent && info.remote,
        "{info:?}"
    );
    assert!(
        v.fetch_block(5).await.unwrap() == want,
        "the fetch of block 5 at its new location"
    );
    check_cached_and_cold(v, 5, want).await;
}

/// Block `b` as a fresh host (an empty cache of its own) reads it from the store.
async fn read_on_a_fresh_host(gate: &Arc<GatedStore>, b: u64) -> Vec<u8> {
    let fresh = tempfile::tempdir().unwrap();
    let store: Arc<dyn object_store::ObjectStore> = gate.clone();
    let cold = open(fresh.path(), store).await;
    let got = read_block(&cold, b).await;
    cold.close().await.unwrap();
    got
}

/// A partial write of block 5 planned while block 5 was cold and remote; before its fetch
/// looks block 5 up, a zero write was flushed (block 5 unmapped). The fetch returns zeros and
/// fills nothing (no error), the write attempts again, finds block 5 unmapped locally too and
/// lands on zeros: the block reads back as exactly zeros with the partial write over them,
/// cached, cold, and on a fresh host.
#[tokio::test]
async fn a_partial_write_whose_fetch_found_its_block_unmapped_lands_on_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 0, None).await;
    unmap_5(&v, 11).await;

    v.fetch_for_write(&[5])
        .await
        .expect("a fetch for a write of a block unmapped since it was seen remote");
    assert_eq!(
        v.cache().block_info(5).state,
        BlockState::NotPresent,
        "nothing filled"
    );
    assert_eq!(v.stats().await.fills_failed, 0);

    let patch = noise(12, PW_LEN);
    partial_write(&v, 5, &patch).await;
    let want = overlaid(&vec![0; BSU], &patch);
    assert!(read_block(&v, 5).await == want, "block 5 before the flush");
    v.sync_to_store().await.unwrap();
    check_cached_and_cold(&v, 5, &want).await;
    assert!(read_block(&v, 4).await == vec![0; BSU], "block 4");

    assert!(
        read_on_a_fresh_host(&gate, 5).await == want,
        "block 5 on a fresh host"
    );
}

/// Block 5 unmapped (zero write flushed), then written again in full (`new`, not flushed):
/// the manifest lags the cache. A fetch of block 5 now (a read or partial write that saw it
/// remote before the zero write) returns zeros, its contents between the flush and the
/// rewrite, and fills nothing: block 5 stays Dirty with `new`. Reads serve `new` from the
/// cache, and a partial write (whose `fetch_for_write` got those zeros) merges with `new`,
/// never with the zeros; the store gets exactly that once flushed.
#[tokio::test]
async fn a_fetch_of_an_unmapped_block_rewritten_since_never_covers_the_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let (v, gate) = gated_volume(dir.path(), 0, None).await;
    unmap_5(&v, 13).await;
    let new = noise(14, BSU);
    v.write(5 * u64::from(BS), &new).await.unwrap();
    assert_eq!(v.cache().block_info(5).state, BlockState::Dirty);

    assert_eq!(
        v.fetch_block(5).await.unwrap(),
        vec![0; BSU],
        "the fetch of a block mapped nowhere"
    );
    v.fetch_for_write(&[5]).await.unwrap();
    assert_eq!(
        v.cache().block_info(5).state,
        BlockState::Dirty,
        "the fetches filled nothing over the rewrite"
    );
    assert!(read_block(&v, 5).await == new, "block 5 reads the rewrite");

    let patch = noise(15, PW_LEN);
    partial_write(&v, 5, &patch).await;
    let want = overlaid(&new, &patch);
    assert!(
        read_block(&v, 5).await == want,
        "the partial write merged with the rewrite"
    );
    flush_and_fetch_mapped_again(&v, &want).await;

    assert!(
        read_on_a_fresh_host(&gate, 5).await == want,
        "block 5 on a fresh host"
    );
}

/// The window between a flush's manifest swap and its completion: blocks 4-5 were zeroed and
/// the flush parks right after publishing (block 5 mapped nowhere, still Syncing with the
/// rotation's zeros). A fetch of block 5 there returns zeros (the Syncing block's contents),
/// not `MissingLocation`. A partial write in the window promotes the Syncing zeros and
/// lands on them; the completion then leaves block 5 Dirty and not remote (it is mapped
/// nowhere), the fetch still returns zeros and never an error, and the next flush maps it
/// with the partial write's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_a_flushs_publish_and_its_completion_an_unmapped_block_fetches_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let hook = PauseAt::new(CrashPoint::AfterManifestPublish, 0);
    let (v, gate) = gated_volume(dir.path(), 0, Some(hook.clone())).await;
    write_flush_evict(&v, 4, &noise(16, 2 * BSU)).await;
    v.write_zeroes(4 * u64::from(BS), 2 * u64::from(BS))
        .await
        .unwrap();
    hook.arm();
    let mut flush = {
        let v = v.clone();
        tokio::spawn(async move { v.sync_to_store().await })
    };
    tokio::time::timeout(HANG, hook.parked(&mut flush))
        .await
        .expect("the flush parked after its publish");
    // What the window shows is collected first and checked once the flush goes on: a
    // failed check must not leave the flush parked (the runtime could not shut down).
    let mapped = v.stats().await.mapped_blocks;
    let syncing = v.cache().block_info(5);
    let fetched = v.fetch_block(5).await;
    let mut before = vec![0xEE; BSU];
    let read_before = v.read(5 * u64::from(BS), &mut before).await;
    let patch = noise(17, PW_LEN);
    let wrote = v.write(5 * u64::from(BS) + PW_AT as u64, &patch).await;
    let dirty = v.cache().block_info(5);
    let mut after = vec![0xEE; BSU];
    let read_after = v.read(5 * u64::from(BS), &mut after).await;
    hook.go();
    tokio::time::timeout(HANG, flush)
        .await
        .expect("the flush finished")
        .unwrap()
        .unwrap();

    assert_eq!(mapped, 1, "block 5 unmapped by the publish");
    assert_eq!(syncing.state, BlockState::Syncing, "block 5 in the window");
    assert_eq!(
        fetched.expect("no MissingLocation while Syncing"),
        vec![0; BSU],
        "the fetch in the window"
    );
    read_before.unwrap();
    assert!(before == vec![0; BSU], "block 5 read in the window");
    wrote.expect("the partial write in the window");
    assert_eq!(dirty.state, BlockState::Dirty, "after the partial write");
    let want = overlaid(&vec![0; BSU], &patch);
    read_after.unwrap();
    assert!(after == want, "the partial write in the window");

    let info = v.cache().block_info(5);
    assert_eq!(
        info.state,
        BlockState::Dirty,
        "block 5 after the completion"
    );
    assert!(!info.remote, "an unmapped block is never remote");
    assert_eq!(
        v.fetch_block(5)
            .await
            .expect("no MissingLocation once complete"),
        vec![0; BSU]
    );
    assert!(
        read_block(&v, 5).await == want,
        "block 5 after the completion"
    );

    flush_and_fetch_mapped_again(&v, &want).await;

    assert!(
        read_on_a_fresh_host(&gate, 5).await == want,
        "block 5 on a fresh host"
    );
}

/// A zero write and then a non-zero write (`new`) of block 5, each flushed. A fetch of block
/// 5 (by a read that saw it remote before both) returns zeros only while the manifest maps it
/// nowhere (after the first flush, and while `new` is in the cache unflushed), and `new` as
/// soon as the second flush published it: while the block is Clean (the fill is refused, the
/// fetch still reads the new location), and once it is evicted.
#[tokio::test]
async fn a_zero_write_then_a_nonzero_write_both_flushed_fetch_the_new_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (v, _gate) = gated_volume(dir.path(), 0, None).await;
    unmap_5(&v, 18).await;
    assert_eq!(
        v.fetch_block(5).await.unwrap(),
        vec![0; BSU],
        "after the zero write's flush"
    );

    let new = noise(19, BSU);
    v.write(5 * u64::from(BS), &new).await.unwrap();
    assert_eq!(
        v.fetch_block(5).await.unwrap(),
        vec![0; BSU],
        "with the rewrite in the cache, unflushed"
    );
    assert!(
        read_block(&v, 5).await == new,
        "the read serves the rewrite"
    );

    v.sync_to_store().await.unwrap();
    let info = v.cache().block_info(5);
    assert!(info.state == BlockState::Clean && info.remote, "{info:?}");
    assert!(
        v.fetch_block(5).await.unwrap() == new,
        "published, the block Clean"
    );
    assert_eq!(v.cache().block_info(5).state, BlockState::Clean);
    v.evict_to(0).await.unwrap();
    assert!(
        v.fetch_block(5).await.unwrap() == new,
        "published, the block evicted"
    );
    check_cached_and_cold(&v, 5, &new).await;
    assert_eq!(v.stats().await.fills_failed, 0);
}
