//! A promote cut short by the kernel itself: no injected fault. The process's file size
//! limit (`RLIMIT_FSIZE`, which the kernel enforces on every write, splice included) ends
//! inside the block being promoted, so the splice of the block's clean bytes into the active
//! file writes its first part and then fails with EFBIG, as a full disk would (ENOSPC) after
//! a short write. The write must fail, the block must keep reading its old bytes (the part
//! copied is punched out again, the block is not Dirty), and the same write must succeed
//! once the limit is lifted and survive a reopen.
//!
//! The limit is the whole process's: this file holds one test, so no other test's files meet
//! it. The kernel sends SIGXFSZ at the failed write, whose default action ends the process: a
//! tokio signal listener takes it instead (and tells the test the kernel did hit the limit).

mod common;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tokio::signal::unix::{signal, SignalKind};

use common::*;
use glidefs_volume::cache::BlockState;

/// The volume: 4,096 blocks of 16 KiB; the block promoted is near the end of the address
/// space, so every other file the volume writes (the WAL, its checkpoint) stays far below
/// the limit set inside it.
const VOL_BLOCKS: u64 = 4096;
const BLOCK: u64 = VOL_BLOCKS - 8;

fn set_file_size_limit(limit: Option<u64>) {
    let hard = getrlimit(Resource::Fsize).maximum;
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: limit,
            maximum: hard,
        },
    )
    .expect("setrlimit(RLIMIT_FSIZE)");
}

/// The OS error code an error carries, anywhere in its chain of sources.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    std::iter::successors(Some(e), |e| e.source())
        .find_map(|e| e.downcast_ref::<std::io::Error>()?.raw_os_error())
}

/// The cache's data files (`data.*`, the active one among them) that hold data in
/// `[at, at + len)`, with the first offset of it (`SEEK_DATA`).
fn data_in(dir: &std::path::Path, at: u64, len: u64) -> Vec<(std::path::PathBuf, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("data.")
        })
        .filter_map(|p| {
            let f = std::fs::File::open(&p).unwrap();
            let data = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(at)).ok()?;
            (data < at + len).then_some((p, data))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promote_cut_short_by_the_kernel_fails_the_write_and_keeps_the_old_bytes() {
    let bs = u64::from(BS);
    let at = BLOCK * bs;
    let mut xfsz = signal(SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw()))
        .expect("listen for SIGXFSZ");
    let dir = tempfile::tempdir().unwrap();
    let store = mem();
    let mut cfg = config(dir.path());
    cfg.size = VOL_BLOCKS * bs;
    let v = glidefs_volume::Volume::open(cfg.clone(), store.clone())
        .await
        .unwrap();

    // The block written, flushed to the store, evicted, read back: Clean, its bytes in the
    // cache's clean file only.
    let old = glidefs_testkit::noise(1, BS as usize);
    v.write(at, &old).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.evict_to(0).await.unwrap();
    let mut got = vec![0; BS as usize];
    v.read(at, &mut got).await.unwrap();
    assert!(got == old, "the block reads back from the store");
    assert_eq!(v.stats().await.blocks_fetched, 1);
    assert_eq!(v.cache().block_info(BLOCK).state, BlockState::Clean);

    // One page in the block's middle: the write promotes the whole block first, and the
    // file size limit ends halfway through it.
    let page = glidefs_testkit::noise(2, 4096);
    let page_at = at + bs / 2 + 4096;
    set_file_size_limit(Some(at + bs / 2));
    let failed = v.write(page_at, &page).await;
    set_file_size_limit(None);
    let e = failed.expect_err("a write whose promote the kernel cut short must fail");
    assert_eq!(
        os_error(&e),
        Some(rustix::io::Errno::FBIG.raw_os_error()),
        "the failure carries the kernel's error: {e}"
    );
    assert!(e.to_string().contains("promote"), "the promote failed: {e}");
    tokio::time::timeout(std::time::Duration::from_secs(5), xfsz.recv())
        .await
        .expect("the kernel sent SIGXFSZ: the splice met the limit")
        .expect("signal stream");

    // The part the splice did copy is punched out of the active file again.
    let left = data_in(dir.path(), at, bs);
    assert!(
        left.is_empty(),
        "data left in the failed promote's block: {left:?}"
    );
    // The block is still Clean and reads as it was.
    assert_eq!(v.cache().block_info(BLOCK).state, BlockState::Clean);
    v.read(at, &mut got).await.unwrap();
    assert!(got == old, "a failed promote leaves the block's old bytes");

    // The same write once the limit is gone, then durable and read back after a reopen.
    v.write(page_at, &page).await.unwrap();
    let mut want = old.clone();
    let in_block = (page_at - at) as usize;
    want[in_block..in_block + page.len()].copy_from_slice(&page);
    v.read(at, &mut got).await.unwrap();
    assert!(got == want, "the write lands once the limit is gone");
    v.flush().await.unwrap();
    v.close().await.unwrap();
    drop(v);
    let v = glidefs_volume::Volume::open(cfg, store).await.unwrap();
    v.read(at, &mut got).await.unwrap();
    assert!(got == want, "the write survives a reopen");
}
