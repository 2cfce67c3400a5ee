//! The multi-stream readahead (crate::readahead, `Volume::note_read`) and the prefetch path
//! it feeds (`Fetcher::prefetch`, `fetch_run`) on odd ranges and racing overwrites (a run
//! whose pack GC deleted is in volume_fetch.rs, `a_readahead_run_whose_pack_gc_deleted_...`):
//!
//! - a read at an offset whose end overflows u64 is refused, not a panic;
//! - extreme but non-overflowing offsets, zero lengths and reads past the end reach
//!   `note_read` without a panic and fetch nothing;
//! - readers taking turns over their own regions, with overwrites of blocks inside their
//!   readahead windows, never read bytes older than a completed write.

mod common;

use std::time::Duration;

use glidefs_cache::BlockState;
use glidefs_testkit::noise;
use glidefs_volume::Volume;

use common::*;

const BSU: usize = BS as usize;

/// `Volume::read` at an offset whose end overflows u64: the cache refuses the range
/// (`check_range` uses `checked_add`); `note_read`, which runs first, does not overflow
/// either (no panic in a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_end_overflows_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), mem()).await;
    let r = tokio::spawn({
        let v = v.clone();
        async move {
            let mut buf = vec![0u8; 4096];
            v.read(u64::MAX - 100, &mut buf).await.map(|()| buf)
        }
    })
    .await;
    match r {
        Ok(Err(_)) => {}
        Ok(Ok(buf)) => panic!("a read past u64::MAX returned {} bytes", buf.len()),
        Err(e) => panic!("a read past u64::MAX panicked: {e}"),
    }
    // The volume still serves reads.
    let d = put_block(&v, 0, 1).await;
    assert_eq!(read_range(&v, 0, BSU).await, d);
}

/// Extreme offsets that do not overflow, zero lengths and reads past the end, each three
/// times in a row (a stream from the third read on): no panic, nothing fetched, and the
/// streams of real reads afterwards still work and read the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_note_reads_neither_panic_nor_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), mem()).await; // readahead 2 blocks
    let data = noise(11, SIZE as usize);
    v.write(0, &data).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let bs = u64::from(BS);
    let extremes: &[(u64, u64)] = &[
        (u64::MAX - 4096, 4096),
        (u64::MAX - 1, 1),
        (u64::MAX, 0),
        (u64::MAX / bs * bs - bs, 1),
        (SIZE, 4096),
        (SIZE - 1, 1),
        ((BLOCKS - 1) * bs, 2 * bs),
        (0, 0),
        (0, u64::MAX),
        (1, u64::MAX - 1),
    ];
    for &(off, len) in extremes {
        for _ in 0..3 {
            v.note_read(off, len);
        }
        // From a plain thread too (the ublk loop thread's path: prefetch_soon).
        let w = v.clone();
        std::thread::spawn(move || {
            for _ in 0..3 {
                w.note_read(off, len);
            }
        })
        .join()
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // (0, u64::MAX) and (1, u64::MAX - 1) are reads of every block: a stream from 0 whose
    // window is past the end, so nothing; (BLOCKS-1)*bs.. is past the end too.
    let s = v.stats().await;
    assert_eq!(s.readahead_started, 0, "{s:?}");
    assert!((0..BLOCKS).all(|b| v.cache().block_info(b).state == BlockState::NotPresent));
    for b in 0..BLOCKS {
        let got = read_range(&v, b * bs, BSU).await;
        assert!(
            got[..] == data[(b * bs) as usize..((b + 1) * bs) as usize],
            "block {b}"
        );
    }
}

/// Four readers take turns, each reading its own 16-block region in 4 KiB steps; between
/// turns a block inside some reader's readahead window (prefetched, possibly still in
/// flight) is overwritten, sometimes flushed and evicted. Every read returns the bytes of
/// the last completed write, and a reread of each region after all that too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_in_turn_with_overwrites_in_their_windows_read_the_latest_bytes() {
    const REGION: u64 = 16;
    const READERS: u64 = 4;
    let blocks = REGION * READERS;
    let size = blocks * u64::from(BS);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config_at(dir.path(), size);
    cfg.readahead_blocks = 6;
    let v = Volume::open(cfg, mem()).await.unwrap();
    let mut img = noise(21, size as usize);
    v.write(0, &img).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let step = 4096u64;
    let steps = REGION * u64::from(BS) / step;
    let mut seed = 100;
    for i in 0..steps {
        for r in 0..READERS {
            let off = r * REGION * u64::from(BS) + i * step;
            let got = read_range(&v, off, step as usize).await;
            assert!(
                got[..] == img[off as usize..(off + step) as usize],
                "reader {r} step {i}"
            );
            // Overwrite a block a few blocks ahead of this reader (inside its window).
            if i % 3 == r % 3 {
                let b = off / u64::from(BS) + 2 + (i % 3);
                if b < (r + 1) * REGION {
                    seed += 1;
                    let at = b * u64::from(BS);
                    // Half a block: a partial write that needs the block (joins or fetches).
                    let d = noise(seed, BSU / 2);
                    v.write(at + 4096, &d).await.unwrap();
                    img[(at + 4096) as usize..(at + 4096) as usize + d.len()].copy_from_slice(&d);
                    if seed % 4 == 0 {
                        v.sync_to_store().await.unwrap();
                        v.evict_to(0).await.unwrap();
                    }
                }
            }
        }
    }
    v.evict_to(0).await.unwrap();
    let back = read_range(&v, 0, size as usize).await;
    assert!(back == img, "the whole volume after the readers");
}
