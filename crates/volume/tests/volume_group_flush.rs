//! Group commit to the store (`Volume::flush_to_store`, the FLUSH of `durability = "store"`):
//! when it returns, every write completed before the call reads back from the store alone (a
//! fresh host); FLUSHes arriving while one sync is held in the store share the next sync; a
//! failed sync fails the FLUSHes it was to cover, and the next FLUSH starts over; a caller
//! arriving during a sync that then fails is served by the next sync; a sync that panics
//! fails its FLUSHes and the next FLUSH leads again (no FLUSH hangs).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::{CrashHook, CrashPoint};
use glidefs_volume::{Durability, VolumeErrorKind};

/// Block `b`'s data for `seed`.
fn block(b: usize, seed: u64) -> Vec<u8> {
    (0..PPB)
        .flat_map(|p| page_data(seed, b * PPB + p))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_to_store_makes_every_completed_write_readable_from_the_store_alone() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let mut oracle = Oracle::new();
    write_blocks(&v, &mut oracle, 1, &[0, 3, 7]).await;
    let before = vstore(&store).latest_generation().await.unwrap();
    let g = v.flush_to_store().await.unwrap();
    assert!(g > before, "published {g} after {before}");
    oracle.durable();
    // Nothing written since: a FLUSH still gets a sync of its own (cheap: nothing to upload)
    // and the same data.
    v.flush_to_store().await.unwrap();
    let figures = v.group_figures();
    assert_eq!((figures.flushes, figures.syncs), (2, 2));
    v.kill().await;
    check_fresh_host(&store, &oracle, "after flush_to_store and a crash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_arriving_during_a_held_sync_share_the_next_one() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let first = block(0, 1);
    v.write(0, &first).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let leader = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    faulty.wait_held(1).await;
    // Twelve FLUSHes, each after a write of its own block, while the first sync is held.
    let mut flushes = Vec::new();
    let mut written = vec![(0usize, first)];
    for b in 1..13usize {
        let data = block(b % BLOCKS as usize, 10 + b as u64);
        v.write((b % BLOCKS as usize) as u64 * u64::from(BS), &data)
            .await
            .unwrap();
        written.retain(|(w, _)| *w != b % BLOCKS as usize);
        written.push((b % BLOCKS as usize, data));
        let v = v.clone();
        flushes.push(tokio::spawn(async move { v.flush_to_store().await }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(v.group_figures().syncs, 0, "the first sync is still held");
    faulty.release_held();
    let g1 = leader.await.unwrap().unwrap();
    let mut gens = Vec::new();
    for f in flushes {
        gens.push(f.await.unwrap().unwrap());
    }
    assert!(gens.iter().all(|g| *g > g1), "{gens:?} after {g1}");
    let figures = v.group_figures();
    assert_eq!(figures.flushes, 13);
    assert_eq!(figures.syncs, 2, "one held sync, then one for the twelve");
    v.kill().await;
    let fresh = tempfile::tempdir().unwrap();
    let w = open(fresh.path(), mem.clone()).await;
    for (b, data) in written {
        assert_eq!(
            read_range(&w, b as u64 * u64::from(BS), BSU).await,
            data,
            "block {b} from the store"
        );
    }
    w.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_fails_its_flushes_and_the_next_flush_starts_over() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let data = block(2, 5);
    v.write(2 * u64::from(BS), &data).await.unwrap();
    faulty.set_outage(true);
    let err = v.flush_to_store().await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("group 1"), "{err}");
    faulty.set_outage(false);
    v.flush_to_store().await.unwrap();
    v.kill().await;
    let fresh = tempfile::tempdir().unwrap();
    let w = open(fresh.path(), mem.clone()).await;
    assert_eq!(read_range(&w, 2 * u64::from(BS), BSU).await, data);
    w.close().await.unwrap();
}

/// The device's FLUSH (`flush_durable`): with `Durability::Store` the store has the writes
/// when it returns; with `Local` (the default) only the local disk does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_durable_reaches_the_store_only_with_store_durability() {
    for durability in [Durability::Local, Durability::Store] {
        let store = mem();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.durability = durability;
        let v = glidefs_volume::Volume::open(cfg, store.clone())
            .await
            .unwrap();
        let before = vstore(&store).latest_generation().await.unwrap();
        let data = block(1, 9);
        v.write(u64::from(BS), &data).await.unwrap();
        v.flush_durable().await.unwrap();
        let after = vstore(&store).latest_generation().await.unwrap();
        v.kill().await;
        let fresh = tempfile::tempdir().unwrap();
        let w = open(fresh.path(), store.clone()).await;
        let got = read_range(&w, u64::from(BS), BSU).await;
        w.close().await.unwrap();
        match durability {
            Durability::Store => {
                assert!(after > before, "published");
                assert_eq!(got, data, "in the store");
            }
            Durability::Local => {
                assert_eq!(after, before, "nothing published by a local FLUSH");
                assert_eq!(got, vec![0; BSU], "only on the lost disk");
            }
        }
    }
}

/// A "bug" in the flush path: the first sync to reach its pack upload panics (any panic on
/// that path: an `unwrap` in a dependency, an arithmetic overflow in a debug build, an
/// allocation failure...). Once.
#[derive(Debug, Default)]
struct PanicOnce {
    fired: AtomicBool,
}

impl CrashHook for PanicOnce {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point == CrashPoint::BeforePackUpload && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("injected: a panic inside sync_to_store (group leader task)");
        }
        false
    }
}

/// A group leader whose sync panics (or whose task is aborted) leaves no FLUSH waiting: the
/// FLUSH during which the sync panicked returns (an error), and the next FLUSH leads a sync
/// of its own and succeeds. The leader's drop guard clears `leading` on any exit, not only
/// an orderly one; without it no later `flush_to_store` would spawn a leader and every
/// waiter would hang (the guest's I/O stalled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_sync_fails_its_flushes_and_the_next_flush_leads_again() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.durability = Durability::Store;
    cfg.crash_hook = Arc::new(PanicOnce::default());
    let v = glidefs_volume::Volume::open(cfg, store.clone())
        .await
        .unwrap();
    v.write(0, &vec![7u8; BS as usize]).await.unwrap();

    let first = tokio::time::timeout(Duration::from_secs(3), v.flush_durable()).await;
    let second = tokio::time::timeout(Duration::from_secs(3), v.flush_durable()).await;
    let figures = v.group_figures();
    assert!(
        first.is_ok() && matches!(second, Ok(Ok(()))),
        "after a panic in the group's sync: first FLUSH {}, second FLUSH {} \
         (group figures {figures:?}: the leader died with `leading` still set)",
        match &first {
            Ok(r) => format!("returned {r:?}"),
            Err(_) => "HUNG (3 s)".into(),
        },
        match &second {
            Ok(r) => format!("returned {r:?}"),
            Err(_) => "HUNG (3 s)".into(),
        },
    );
}

/// A caller that arrives while a sync runs needs the NEXT sync (the running one rotated before its
/// write completed), so that sync's *failure* does not answer it, and the next sync's success
/// covers its write (re-publishing the failed sync's pending rotation first). Epoch 1's pack upload
/// is held while the caller writes and arrives; epoch 1 then fails at its manifest PUT; the
/// caller's FLUSH must succeed and a fresh host must read its write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_arriving_during_a_failing_sync_is_served_by_the_next() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let a = vec![1u8; BSU];
    v.write(0, &a).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("/packs/")
            .times(1),
    );
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let first = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    faulty.wait_held(1).await;
    let b = vec![2u8; BSU];
    v.write(u64::from(BS), &b).await.unwrap();
    let second = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    faulty.release_held();
    let r1 = first.await.unwrap();
    let r2 = second.await.unwrap();
    assert_eq!(
        faulty.plan().faults_fired(),
        2,
        "the hold and the failed manifest PUT fired"
    );
    assert!(r2.is_ok(), "the later caller: {r2:?} (first: {r1:?})");
    assert_eq!(
        v.group_figures().syncs,
        2,
        "epoch 1 failed, epoch 2 served the caller"
    );
    v.kill().await;
    let fresh = tempfile::tempdir().unwrap();
    let w = open(fresh.path(), mem.clone()).await;
    assert_eq!(read_range(&w, 0, BSU).await, a);
    assert_eq!(read_range(&w, u64::from(BS), BSU).await, b);
    w.close().await.unwrap();
}

/// Panics once at `point` (a bug in the flush path, as `PanicOnce`, at another point).
#[derive(Debug)]
struct PanicOnceAt {
    point: CrashPoint,
    fired: AtomicBool,
}

impl PanicOnceAt {
    fn new(point: CrashPoint) -> Self {
        Self {
            point,
            fired: AtomicBool::new(false),
        }
    }
}

impl CrashHook for PanicOnceAt {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point == self.point && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("injected: a panic inside sync_to_store at {point:?} (group leader task)");
        }
        false
    }
}

/// A caller that arrives while epoch 1's sync runs needs epoch 2. When epoch 1's sync
/// panics, the leader's drop guard fails epoch 1 and clears `leading`, but nobody runs
/// epoch 2: the caller must still be answered (an error or, better, epoch 2's success)
/// without waiting for some later FLUSH to start a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_arriving_during_a_sync_that_panics_is_not_stranded() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.durability = Durability::Store;
    cfg.crash_hook = Arc::new(PanicOnceAt::new(CrashPoint::AfterPackUpload));
    let v = glidefs_volume::Volume::open(cfg, store.clone())
        .await
        .unwrap();
    v.write(0, &vec![1u8; BSU]).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("/packs/")
            .times(1),
    );
    // Epoch 1: its pack upload is held.
    let first = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    faulty.wait_held(1).await;
    // A write, then a FLUSH, while epoch 1 runs: this caller needs epoch 2.
    let b = vec![2u8; BSU];
    v.write(u64::from(BS), &b).await.unwrap();
    let mut second = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Epoch 1's upload lands, then its sync panics (AfterPackUpload).
    faulty.release_held();
    let r1 = tokio::time::timeout(Duration::from_secs(5), first).await;
    assert!(
        matches!(r1, Ok(Ok(Err(_)))),
        "epoch 1's caller fails: {r1:?}"
    );
    let r2 = tokio::time::timeout(Duration::from_secs(5), &mut second).await;
    if r2.is_err() {
        // Stranded: only another FLUSH starts a leader that runs epoch 2.
        let third = v.flush_to_store().await;
        let after = tokio::time::timeout(Duration::from_secs(5), second).await;
        panic!(
            "the FLUSH that arrived during the panicking sync HUNG for 5 s (group figures {:?}); \
             a third FLUSH ({third:?}) then released it: {after:?}",
            v.group_figures()
        );
    }
    let r2 = r2.unwrap().unwrap();
    // Whatever the answer, an Ok must mean the write is in the store.
    if r2.is_ok() {
        v.kill().await;
        let fresh = tempfile::tempdir().unwrap();
        let w = open(fresh.path(), mem.clone()).await;
        assert_eq!(read_range(&w, u64::from(BS), BSU).await, b);
        w.close().await.unwrap();
    }
}

/// A leader task dropped before its first poll (its runtime shut down right after the
/// caller spawned it, or the caller ran on a runtime that went away) never built its drop
/// guard, so `leading` stays set with no leader: every later FLUSH of the volume must
/// still be answered.
#[test]
fn a_leader_dropped_before_its_first_poll_does_not_wedge_the_group() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = rt.block_on(async {
        let mut cfg = config(dir.path());
        cfg.durability = Durability::Store;
        let v = glidefs_volume::Volume::open(cfg, store.clone())
            .await
            .unwrap();
        v.write(0, &vec![3u8; BSU]).await.unwrap();
        v
    });
    // A caller on a runtime that ends right after the caller's first poll: the leader it
    // spawned there is queued, never polled, and dropped with the runtime (the caller too).
    let side = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    side.block_on(async {
        let mut f = std::pin::pin!(v.flush_to_store());
        assert!(futures::poll!(f.as_mut()).is_pending());
    });
    drop(side);
    let later = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), v.flush_to_store()).await });
    assert!(
        later.is_ok(),
        "a FLUSH after the unpolled leader was dropped HUNG for 5 s (group figures {:?})",
        v.group_figures()
    );
    rt.block_on(async { v.close().await.unwrap() });
}
