//! Snapshots and clones through the engine: a snapshot holds exactly the writes completed
//! before it, pins its packs against GC and compaction, opens as a read-only view; a clone
//! starts from it and diverges; a crash at any store call of snapshot create, snapshot delete
//! or clone create loses no acknowledged write and leaves nothing a snapshot needs collectable.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_objstore::{StoreConfig, VolumeStore};
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::{
    CompactOptions, SnapshotProblem, Volume, VolumeConfig, VolumeError, VolumeErrorKind,
};

const CLONE: &str = "vol-clone";

/// A read-only view of snapshot `name` of the test volume, on its own cache directory.
async fn view(
    dir: &std::path::Path,
    store: &Arc<dyn object_store::ObjectStore>,
    name: &str,
) -> Arc<Volume> {
    let mut cfg = config(dir);
    cfg.snapshot = Some(name.into());
    Volume::open(cfg, store.clone()).await.unwrap()
}

fn clone_cfg(dir: &std::path::Path) -> VolumeConfig {
    let mut cfg = config(dir);
    cfg.name = CLONE.into();
    cfg.owner = Some(B.into());
    cfg
}

fn all_blocks() -> Vec<usize> {
    (0..BLOCKS as usize).collect()
}

/// A volume on `store` (opened as `owner`, if any) with every block written (seed 1), not
/// flushed.
async fn written_on(
    store: &Arc<dyn object_store::ObjectStore>,
    owner: Option<&str>,
) -> (tempfile::TempDir, Arc<Volume>, Oracle) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = match owner {
        Some(o) => owned(dir.path(), o, false),
        None => config(dir.path()),
    };
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    write_blocks(&v, &mut oracle, 1, &all_blocks()).await;
    (dir, v, oracle)
}

/// `written_on` a fresh memory store, without an owner.
async fn written() -> (
    Arc<dyn object_store::ObjectStore>,
    tempfile::TempDir,
    Arc<Volume>,
    Oracle,
) {
    let store = mem();
    let (dir, v, oracle) = written_on(&store, None).await;
    (store, dir, v, oracle)
}

async fn stored_packs(store: &Arc<dyn object_store::ObjectStore>) -> usize {
    vstore(store).list_packs().await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_holds_the_writes_before_it_and_its_view_is_read_only() {
    let (store, _dir, v, mut oracle) = written().await;
    // No flush before: the snapshot flushes what was written.
    let record = v.create_snapshot("s1").await.unwrap();
    assert_eq!(record.generation, v.stats().await.manifest_generation);
    let at_snapshot = oracle.clone();
    write_blocks(&v, &mut oracle, 2, &[0, 3, 5, 15]).await;
    v.sync_to_store().await.unwrap();
    v.write_zeroes(0, u64::from(BS) * 2).await.unwrap();
    for p in 0..2 * PPB {
        oracle.write(p, vec![0; PAGE]);
    }
    v.sync_to_store().await.unwrap();
    gc_hard(&store).await;

    let vdir = tempfile::tempdir().unwrap();
    let snap = view(vdir.path(), &store, "s1").await;
    at_snapshot.assert_pages(0, &read_all(&snap).await, "snapshot view");
    oracle.assert_pages(0, &read_all(&v).await, "volume");
    // The view refuses everything that would change the volume.
    for (what, err) in [
        ("write", snap.write(0, &[1; PAGE]).await.unwrap_err()),
        (
            "compaction",
            snap.compact(CompactOptions::default()).await.unwrap_err(),
        ),
        (
            "gc",
            snap.collect_garbage(Default::default()).await.unwrap_err(),
        ),
        ("snapshot", snap.create_snapshot("x").await.unwrap_err()),
    ] {
        assert!(matches!(err, VolumeError::ReadOnly { .. }), "{what}: {err}");
        assert!(err.to_string().contains("read-only snapshot `s1`"), "{err}");
    }
    assert_eq!(snap.sync_to_store().await.unwrap().blocks, 0);
    snap.close().await.unwrap();
    // A view of a snapshot that does not exist is a clear error.
    let mut cfg = config(vdir.path());
    cfg.snapshot = Some("nope".into());
    let err = Volume::open(cfg, store.clone()).await.unwrap_err();
    assert_eq!(err.kind(), VolumeErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("vol-test@nope"), "{err}");
    // Names are checked, and taken once.
    for (name, want) in [
        ("a/b", SnapshotProblem::InvalidName),
        ("s1", SnapshotProblem::Exists),
    ] {
        match v.create_snapshot(name).await.unwrap_err() {
            VolumeError::Snapshot { problem, .. } => assert_eq!(problem, want, "{name}"),
            other => panic!("{name}: {other}"),
        }
    }
    check_fresh_host(&store, &oracle, "fresh host").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_leaves_a_snapshots_packs_alone_until_it_is_deleted() {
    let (store, _dir, v, mut oracle) = written().await;
    v.create_snapshot("s1").await.unwrap();
    let at_snapshot = oracle.clone();
    let dead: Vec<usize> = all_blocks().into_iter().filter(|b| b % 4 != 0).collect();
    write_blocks(&v, &mut oracle, 2, &dead).await;
    v.sync_to_store().await.unwrap();
    let opts = CompactOptions {
        threshold: 0.5,
        ..CompactOptions::default()
    };
    let r = v.compact(opts).await.unwrap();
    assert_eq!((r.packs_pinned, r.packs_rewritten), (4, 0), "{r:?}");
    gc_hard(&store).await;
    let pinned = stored_packs(&store).await;
    let vdir = tempfile::tempdir().unwrap();
    let snap = view(vdir.path(), &store, "s1").await;
    at_snapshot.assert_pages(
        0,
        &read_all(&snap).await,
        "snapshot after compaction and gc",
    );
    snap.close().await.unwrap();

    v.delete_snapshot("s1").await.unwrap();
    let r = v.compact(opts).await.unwrap();
    assert_eq!((r.packs_pinned, r.packs_rewritten), (0, 4), "{r:?}");
    gc_hard(&store).await;
    assert!(
        stored_packs(&store).await < pinned,
        "the snapshot's packs are released"
    );
    oracle.assert_pages(0, &read_all(&v).await, "volume");
    check_fresh_host(&store, &oracle, "fresh host").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_starts_from_the_snapshot_and_the_two_diverge() {
    let store = mem();
    let (_dir, v, mut oracle) = written_on(&store, Some(A)).await;
    v.create_snapshot("base").await.unwrap();
    let cdir = tempfile::tempdir().unwrap();
    let c = Volume::create_clone(clone_cfg(cdir.path()), store.clone(), "vol-test", "base")
        .await
        .unwrap();
    let mut cloned = oracle.clone();
    cloned.assert_pages(0, &read_all(&c).await, "clone at start");
    assert_eq!(c.owner().unwrap().id, B);
    // Each side writes (and discards) different blocks.
    write_blocks(&v, &mut oracle, 2, &[0, 1, 2]).await;
    write_blocks(&c, &mut cloned, 3, &[2, 3, 4]).await;
    c.write_zeroes(u64::from(BS) * 6, u64::from(BS))
        .await
        .unwrap();
    for p in 6 * PPB..7 * PPB {
        cloned.write(p, vec![0; PAGE]);
    }
    v.sync_to_store().await.unwrap();
    c.sync_to_store().await.unwrap();
    // Space work on both sides, as hard as it goes.
    let opts = CompactOptions {
        threshold: 1.0,
        ..CompactOptions::default()
    };
    v.compact(opts).await.unwrap();
    c.compact(opts).await.unwrap();
    gc_hard(&store).await;
    c.collect_garbage(hard_gc()).await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "origin");
    cloned.assert_pages(0, &read_all(&c).await, "clone");
    // The snapshot cannot be deleted while the clone uses it.
    let err = v.delete_snapshot("base").await.unwrap_err();
    assert!(
        err.to_string().contains("clones use it: vol-clone"),
        "{err}"
    );
    // Fresh hosts read both from the store alone.
    check_fresh_host(&store, &oracle, "origin, fresh host").await;
    c.close().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let c2 = Volume::open(clone_cfg(fresh.path()), store.clone())
        .await
        .unwrap();
    cloned.assert_pages(0, &read_all(&c2).await, "clone, fresh host");
    // A clone of the clone.
    c2.create_snapshot("c-snap").await.unwrap();
    let gdir = tempfile::tempdir().unwrap();
    let mut gcfg = config(gdir.path());
    gcfg.name = "vol-grandchild".into();
    let g = Volume::create_clone(gcfg, store.clone(), CLONE, "c-snap")
        .await
        .unwrap();
    cloned.assert_pages(0, &read_all(&g).await, "clone of the clone");
}

/// One writer rewrites whole blocks in sequence (write `k` puts `seed k` into block `k %
/// BLOCKS`) while a snapshot is taken: the snapshot equals the volume after some prefix of
/// the writes that includes every write completed before the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_during_writes_is_a_prefix_of_them() {
    let (store, _dir, v, _oracle) = written().await;
    v.sync_to_store().await.unwrap();
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (v, acked, stop) = (v.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) && k < 4000 {
                k += 1;
                let block = (k % BLOCKS) as usize;
                let data: Vec<u8> = (block * PPB..(block + 1) * PPB)
                    .flat_map(|p| page_data(100 + k, p))
                    .collect();
                v.write((block * BS as usize) as u64, &data).await.unwrap();
                acked.store(k, std::sync::atomic::Ordering::Release);
            }
            k
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let before = acked.load(std::sync::atomic::Ordering::Acquire);
    v.create_snapshot("mid").await.unwrap();
    let after = acked.load(std::sync::atomic::Ordering::Acquire) + 1;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let last = writer.await.unwrap();
    assert!(
        before > 0 && last > before,
        "writes ran across the snapshot"
    );

    let vdir = tempfile::tempdir().unwrap();
    let snap = view(vdir.path(), &store, "mid").await;
    let image = read_all(&snap).await;
    // Which write each block holds in the snapshot (1 = the initial content).
    let bs = BS as usize;
    let mut held = vec![0u64; BLOCKS as usize];
    for (b, h) in held.iter_mut().enumerate() {
        let got = &image[b * bs..(b + 1) * bs];
        let first: Vec<u8> = (b * PPB..(b + 1) * PPB)
            .flat_map(|p| page_data(1, p))
            .collect();
        *h = if got == &first[..] {
            0
        } else {
            (1..=after)
                .rev()
                .filter(|k| (k % BLOCKS) as usize == b)
                .find(|k| {
                    let want: Vec<u8> = (b * PPB..(b + 1) * PPB)
                        .flat_map(|p| page_data(100 + k, p))
                        .collect();
                    got == &want[..]
                })
                .unwrap_or_else(|| panic!("block {b} holds none of the writes to it"))
        };
    }
    // Some cut c in [before, after] explains every block: its newest write with k <= c.
    let explains = |c: u64| {
        held.iter().enumerate().all(|(b, &h)| {
            let newest = (1..=c)
                .rev()
                .find(|k| (k % BLOCKS) as usize == b)
                .unwrap_or(0);
            newest == h
        })
    };
    assert!(
        (before..=after).any(explains),
        "the snapshot is no prefix of the writes: before={before} after={after} held={held:?}"
    );
}

/// Runs `op` with every PUT and DELETE of the store held, letting the first `n` through, and
/// "crashes" once more are under way (the task is dropped with them held: they never reach
/// the store; concurrent uploads may be held together). Returns whether the op finished
/// without passing `n` writes.
async fn crash_at_call<T: Send + 'static>(
    faulty: &FaultyStore,
    n: u64,
    op: impl std::future::Future<Output = T> + Send + 'static,
) -> bool {
    let writes = || {
        let c = faulty.counts();
        c.calls(Op::Put) + c.calls(Op::Delete)
    };
    let base = writes();
    faulty.inject(FaultRule::new(Fault::Hold).ops(&[Op::Put, Op::Delete]));
    let mut task = tokio::spawn(op);
    let finished = loop {
        tokio::select! {
            _ = &mut task => break true,
            _ = faulty.plan().wait_held(1) => {}
        }
        if writes() - base > n {
            task.abort();
            let _ = (&mut task).await;
            break false;
        }
        faulty.plan().release_held();
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    faulty.clear_faults();
    faulty.plan().release_held();
    finished
}

/// Kill during snapshot create, snapshot delete and clone create, at every store write of
/// each: after a restart every acknowledged write reads back, each snapshot that exists reads
/// its point in time after the hardest GC, and a clone that exists reads its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_store_write_of_a_snapshot_or_clone_operation_loses_nothing() {
    for phase in ["create", "delete", "clone"] {
        for n in 0.. {
            let ctx = format!("{phase}, crash at store write {n}");
            let faulty = Arc::new(FaultyStore::new(mem()));
            let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
            let (dir, v, mut oracle) = written_on(&store, Some(A)).await;
            if phase != "create" {
                v.create_snapshot("s").await.unwrap();
            }
            let at_snapshot = oracle.clone();
            write_blocks(&v, &mut oracle, 2, &[1, 2]).await;
            let at_call = oracle.clone();
            let cdir = tempfile::tempdir().unwrap();
            let finished = match phase {
                "create" => {
                    let v2 = v.clone();
                    crash_at_call(&faulty, n, async move { v2.create_snapshot("s").await }).await
                }
                "delete" => {
                    v.sync_to_store().await.unwrap();
                    let v2 = v.clone();
                    crash_at_call(&faulty, n, async move { v2.delete_snapshot("s").await }).await
                }
                _ => {
                    let (cfg, s) = (clone_cfg(cdir.path()), store.clone());
                    crash_at_call(&faulty, n, async move {
                        Volume::create_clone(cfg, s, "vol-test", "s")
                            .await
                            .map(|_| ())
                    })
                    .await
                }
            };
            v.kill().await;
            drop(v);
            // Restart: the acknowledged writes that were flushed (all of them in "delete",
            // those before the crash point otherwise: the oracle allows either).
            let v = Volume::open(owned(dir.path(), A, false), store.clone())
                .await
                .unwrap();
            oracle.check_after_crash(&read_all(&v).await, &ctx);
            v.sync_to_store().await.unwrap();
            gc_hard(&store).await;
            let snap = v.snapshot("s").await.unwrap();
            if let Some(info) = snap.as_ref().filter(|i| i.deleting) {
                // An interrupted delete (completed below): no view may attach it meanwhile.
                let vdir = tempfile::tempdir().unwrap();
                let mut cfg = config(vdir.path());
                cfg.snapshot = Some("s".into());
                let refused = Volume::open(cfg, store.clone()).await.map(|_| ());
                assert!(
                    matches!(
                        refused,
                        Err(VolumeError::Snapshot {
                            problem: SnapshotProblem::Deleting,
                            ..
                        })
                    ),
                    "{ctx}: a view of a snapshot being deleted: {refused:?} ({info:?})"
                );
            } else if let Some(info) = &snap {
                let vdir = tempfile::tempdir().unwrap();
                let view = view(vdir.path(), &store, "s").await;
                let image = read_all(&view).await;
                // "create": recorded only after its flush, so it holds every write before
                // the call.
                let expect = if phase == "create" {
                    &at_call
                } else {
                    &at_snapshot
                };
                expect.assert_pages(0, &image, &ctx);
                // Closed, so its registration does not hold up the delete's retry below.
                view.close().await.unwrap();
                assert!(
                    !info.clones.is_empty() || phase != "clone" || !finished,
                    "{ctx}"
                );
            }
            if phase == "clone" {
                let clone = vstore(&store).sibling(CLONE).unwrap();
                if clone.latest_generation().await.unwrap() > 0 {
                    let fresh = tempfile::tempdir().unwrap();
                    let c = Volume::open(clone_cfg(fresh.path()), store.clone())
                        .await
                        .unwrap();
                    at_snapshot.assert_pages(0, &read_all(&c).await, &ctx);
                    assert!(snap.is_some(), "{ctx}: a clone exists without its snapshot");
                }
            }
            if phase == "delete" && snap.is_some() {
                // Interrupted: the retry completes it.
                v.delete_snapshot("s").await.unwrap();
            }
            check_fresh_host_owned(&store, &oracle, &ctx).await;
            if finished {
                eprintln!("{phase}: {n} crash points");
                // Snapshot create: the flush's pack and manifest, the record; delete: the
                // marker, the record, the marker; clone: registration, origin, generation 1,
                // the clone's claim.
                assert!(n >= 3, "{phase}: only {n} store writes");
                break;
            }
        }
    }
}

async fn check_fresh_host_owned(
    store: &Arc<dyn object_store::ObjectStore>,
    oracle: &Oracle,
    ctx: &str,
) {
    let fresh = tempfile::tempdir().unwrap();
    let v = Volume::open(owned(fresh.path(), A, true), store.clone())
        .await
        .unwrap();
    oracle.assert_pages(0, &read_all(&v).await, ctx);
    v.close().await.unwrap();
}

/// (Review finding.) A snapshot view is documented read-only ("writes, flushes to the store,
/// compaction and GC are refused"), and `Volume::open` drops the owner only for the claim.
/// `release` is not refused: opened with an owner id (a caller reusing the volume's config
/// and this host's owner id, e.g. `owned(dir, A, ..)` plus `snapshot`), the view publishes the *snapshot's* block map as the
/// origin's next generation, marked released by that owner. When the origin has not
/// published since the snapshot, that lands: the origin is rolled back to the snapshot and
/// its writer is fenced, so every write it acknowledged after the snapshot (in its cache,
/// not yet flushed) is lost. Fix: `release` (and anything that publishes) must call
/// `check_publisher` first; or `Volume::open` should clear `cfg.owner` for a view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_snapshot_view_must_not_publish_into_the_origin() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let v = open_as(dir.path(), &store, A, false).await.unwrap();
    let mut oracle = Oracle::new();
    write_blocks(&v, &mut oracle, 1, &all_blocks()).await;
    let record = v.create_snapshot("s1").await.unwrap();
    // Acknowledged writes after the snapshot, still in the origin's cache.
    write_blocks(&v, &mut oracle, 2, &[0, 1, 2, 3]).await;

    let vdir = tempfile::tempdir().unwrap();
    // The same host's owner id as the origin's writer (a different one is OwnedElsewhere).
    let mut cfg = owned(vdir.path(), A, false);
    cfg.snapshot = Some("s1".into());
    let view = Volume::open(cfg, store.clone()).await.unwrap();
    let released = view.release().await;
    let latest = vstore(&store).latest_generation().await.unwrap();
    // The origin's writer goes on: its flush must publish the acknowledged writes.
    let synced = v.sync_to_store().await;
    assert!(
        matches!(released, Err(VolumeError::ReadOnly { .. }))
            && latest == record.generation
            && synced.is_ok(),
        "release of a read-only view of s1 (generation {}): {released:?}; the origin's newest \
         generation is now {latest}; the origin's flush of its acknowledged writes: {:?}",
        record.generation,
        synced.map(|r| r.generation)
    );
    check_fresh_host(&store, &oracle, "origin after the view's release").await;
}

/// (Review, safe: pins the behaviour.) A view of a snapshot stays readable while its origin
/// overwrites blocks, compacts every pack it may, and collects with the hardest GC; the
/// snapshot is then deleted, and only then are its packs collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_survives_its_origins_compaction_and_gc() {
    let (store, _dir, v, mut oracle) = written().await;
    v.create_snapshot("s1").await.unwrap();
    let at_snapshot = oracle.clone();
    let vdir = tempfile::tempdir().unwrap();
    let view = view(vdir.path(), &store, "s1").await;
    // Half of the blocks overwritten: every snapshot pack is half dead.
    write_blocks(&v, &mut oracle, 2, &[0, 2, 4, 6, 8, 10, 12, 14]).await;
    v.sync_to_store().await.unwrap();
    let opts = CompactOptions {
        threshold: 1.0,
        ..CompactOptions::default()
    };
    v.compact(opts).await.unwrap();
    v.sync_to_store().await.unwrap();
    gc_hard(&store).await;
    at_snapshot.assert_pages(0, &read_all(&view).await, "view after compaction + gc");
    oracle.assert_pages(0, &read_all(&v).await, "origin");
    view.close().await.unwrap();
    v.delete_snapshot("s1").await.unwrap();
    gc_hard(&store).await;
    check_fresh_host(&store, &oracle, "origin after the snapshot's packs went").await;
}

/// (Review, safe: pins the behaviour.) A view's cache directory reopened as a view of another
/// snapshot (the daemon names an attachment's directory after the attachment, not after the
/// snapshot) serves that snapshot's data, not the Clean copies the first view read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_views_cache_must_not_serve_another_snapshots_blocks() {
    let (store, _dir, v, mut oracle) = written().await;
    v.create_snapshot("s1").await.unwrap();
    write_blocks(&v, &mut oracle, 2, &all_blocks()).await;
    v.create_snapshot("s2").await.unwrap();
    let at_s2 = oracle.clone();

    let vdir = tempfile::tempdir().unwrap();
    let mut cfg = config(vdir.path());
    cfg.snapshot = Some("s1".into());
    let view1 = Volume::open(cfg.clone(), store.clone()).await.unwrap();
    read_all(&view1).await;
    view1.close().await.unwrap();
    // The same directory, now a view of s2.
    cfg.snapshot = Some("s2".into());
    let view2 = Volume::open(cfg, store.clone()).await.unwrap();
    at_s2.assert_pages(0, &read_all(&view2).await, "view of s2 on s1's view cache");
    view2.close().await.unwrap();
}

/// A snapshot of an encrypted volume: its view and a clone read it with the volume's key (the
/// clone reads the origin's sealed frames and seals its own), without the key both are
/// refused with the key mismatch, and no object of either volume holds the plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_of_an_encrypted_volume_need_its_key() {
    let key = Arc::new(glidefs_volume::VolumeKey::from_bytes([7; 32]));
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(root.path()).unwrap());
    let mut cfg = config(dir.path());
    cfg.encryption_key = Some(key.clone());
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut oracle = Oracle::new();
    write_blocks(&v, &mut oracle, 1, &all_blocks()).await;
    v.create_snapshot("s").await.unwrap();
    let at_snapshot = oracle.clone();

    let vdir = tempfile::tempdir().unwrap();
    let mut vcfg = config(vdir.path());
    vcfg.snapshot = Some("s".into());
    let err = Volume::open(vcfg.clone(), store.clone()).await.unwrap_err();
    assert!(
        err.key_mismatch().is_some(),
        "a view without the key: {err}"
    );
    vcfg.encryption_key = Some(key.clone());
    let view = Volume::open(vcfg, store.clone()).await.unwrap();
    at_snapshot.assert_pages(0, &read_all(&view).await, "encrypted view");

    let cdir = tempfile::tempdir().unwrap();
    let err = Volume::create_clone(clone_cfg(cdir.path()), store.clone(), "vol-test", "s")
        .await
        .unwrap_err();
    assert!(
        err.key_mismatch().is_some(),
        "a clone without the key: {err}"
    );
    let mut ccfg = clone_cfg(cdir.path());
    ccfg.encryption_key = Some(key);
    let c = Volume::create_clone(ccfg, store.clone(), "vol-test", "s")
        .await
        .unwrap();
    let mut cloned = at_snapshot.clone();
    cloned.assert_pages(0, &read_all(&c).await, "encrypted clone");
    write_blocks(&c, &mut cloned, 9, &[0, 1]).await;
    c.sync_to_store().await.unwrap();
    cloned.assert_pages(0, &read_all(&c).await, "encrypted clone after its writes");
    // No object holds a page of either volume in the clear.
    let probe = page_data(1, 3);
    let needle = &probe[..64];
    let mut stack = vec![root.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "{} holds plaintext",
                    p.display()
                );
            }
        }
    }
}

/// A volume grown and snapshotted before anything was published at the new size: the
/// snapshot records the new size, and its view and a clone open at it (the new blocks read
/// as zeros, the old ones as written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_after_a_resize_has_the_new_size() {
    let (store, _dir, v, oracle) = written().await;
    v.sync_to_store().await.unwrap();
    v.resize(2 * SIZE).await.unwrap();
    let record = v.create_snapshot("grown").await.unwrap();
    assert_eq!(record.volume_size, 2 * SIZE);
    let check = |image: Vec<u8>, what: &str| {
        oracle.assert_pages(0, &image[..SIZE as usize], what);
        assert!(
            image[SIZE as usize..].iter().all(|b| *b == 0),
            "{what}: the new half"
        );
    };
    let vdir = tempfile::tempdir().unwrap();
    let mut cfg = config(vdir.path());
    cfg.size = 2 * SIZE;
    cfg.snapshot = Some("grown".into());
    let view = Volume::open(cfg, store.clone()).await.unwrap();
    let mut image = vec![0; 2 * SIZE as usize];
    view.read(0, &mut image).await.unwrap();
    check(image, "view");
    let cdir = tempfile::tempdir().unwrap();
    let mut ccfg = clone_cfg(cdir.path());
    ccfg.size = 2 * SIZE;
    let c = Volume::create_clone(ccfg, store.clone(), "vol-test", "grown")
        .await
        .unwrap();
    let mut image = vec![0; 2 * SIZE as usize];
    c.read(0, &mut image).await.unwrap();
    check(image, "clone");
}

/// Item 5 (issue 45): host B opens a view of `v@s1`; host A, the owner, deletes `s1` and
/// collects. Before views registered under their snapshot, the delete succeeded, the GC
/// deleted s1's packs and B's cold reads failed. Now the delete is refused naming B, and
/// works once B closed its view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_on_another_host_keeps_its_snapshot_from_being_deleted() {
    let store = mem();
    let (_da, a, mut oracle) = written_on(&store, Some(A)).await;
    a.create_snapshot("s1").await.unwrap();
    let at_s1 = oracle.clone();
    write_blocks(&a, &mut oracle, 2, &all_blocks()).await;
    a.sync_to_store().await.unwrap();

    let db = tempfile::tempdir().unwrap();
    let mut cfg = config(db.path());
    cfg.snapshot = Some("s1".into());
    cfg.owner = Some(B.into());
    let b = Volume::open(cfg, store.clone()).await.unwrap();

    let refused = a.delete_snapshot("s1").await;
    if refused.is_ok() {
        gc_hard(&store).await;
    }
    match &refused {
        Err(VolumeError::Snapshot {
            problem: SnapshotProblem::Attached { holders },
            ..
        }) => assert_eq!(holders, &vec![B.to_string()]),
        other => {
            let mut buf = vec![0; PAGE];
            panic!(
                "A deleted s1 while B's view is open ({:?}); B's cold read then: {:?}",
                other.as_ref().map(|r| r.generation),
                b.read(0, &mut buf).await.err()
            )
        }
    }
    gc_hard(&store).await;
    at_s1.assert_pages(
        0,
        &read_all(&b).await,
        "B's view after A's refused delete + GC",
    );

    b.close().await.unwrap();
    a.delete_snapshot("s1")
        .await
        .expect("delete after the view closed");
    gc_hard(&store).await;
    oracle.assert_pages(0, &read_all(&a).await, "A after s1 went");
    check_fresh_host_owned(&store, &oracle, "after s1 went").await;
}

/// `create_clone` with a config that may not publish (a read-only export, a snapshot view)
/// is refused before it writes anything: the store holds no clone and no registration.
#[tokio::test]
async fn a_clone_is_not_created_through_a_read_only_or_view_config() {
    let store = mem();
    let (_dir, v, _oracle) = written_on(&store, Some(A)).await;
    v.create_snapshot("base").await.unwrap();
    for how in ["read_only", "snapshot"] {
        let cdir = tempfile::tempdir().unwrap();
        let mut cfg = clone_cfg(cdir.path());
        match how {
            "read_only" => cfg.read_only = true,
            _ => cfg.snapshot = Some("base".into()),
        }
        let err = Volume::create_clone(cfg, store.clone(), "vol-test", "base")
            .await
            .expect_err(how);
        assert!(
            matches!(err, VolumeError::InvalidConfig { .. }),
            "{how}: {err}"
        );
        let name = clone_cfg(cdir.path()).name;
        let s = VolumeStore::new(store.clone(), &name, StoreConfig::default()).unwrap();
        assert_eq!(
            s.latest_generation().await.unwrap(),
            0,
            "{how}: no generation 1"
        );
        assert!(
            s.origin().await.unwrap().is_none(),
            "{how}: no origin record"
        );
    }
    let info = VolumeStore::new(store.clone(), "vol-test", StoreConfig::default())
        .unwrap()
        .snapshot("base")
        .await
        .unwrap()
        .unwrap();
    assert!(info.clones.is_empty(), "registered: {:?}", info.clones);
}
